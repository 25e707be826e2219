//! `falcon chat`: an interactive chat, one user turn per line.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use clap::Args;

use super::{ModelArgs, SamplingArgs};
use falcon_rl::model::ChatMessage;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let params = args.sampling.params(true)?;
    let policy = args.model.load()?;
    let tok = policy.tokenizer()?;
    let mut history: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &params.system {
        history.push(ChatMessage::new("system", s));
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history.retain(|m| m.role == "system");
                println!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let text = tok.apply_chat_template(&history, true)?;
        let ids = tok.encode(&text, false)?;
        let c = policy
            .generate_ids(&[ids], &params)?
            .pop()
            .context("no completion returned")?;
        println!("{}", c.text.trim_end());
        history.push(ChatMessage::new("assistant", c.text.trim_end()));
    }
    Ok(())
}
