//! The tokenizer of an HF model directory: `tokenizer.json` through the
//! `tokenizers` crate, the chat template from `tokenizer_config.json`
//! rendered as Jinja (minijinja, with Python-style string methods and the
//! `trim_blocks` / `lstrip_blocks` settings transformers uses), and the
//! end-of-sequence ids from `generation_config.json` and `config.json`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use super::ModelError;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Token ids and the byte span `(start, end)` of each in the encoded text.
pub type TokensWithOffsets = (Vec<i64>, Vec<(usize, usize)>);

/// Text ⇄ token ids, plus chat formatting and stop ids.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_ids: BTreeSet<i64>,
    pad_id: Option<i64>,
    source: PathBuf,
    /// Per id: does the token's text hold a backtick? Built at first use.
    backtick: std::sync::OnceLock<Vec<bool>>,
}

fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, ModelError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::bad(path, format!("invalid JSON: {e}")))
}

fn id_list(v: Option<&serde_json::Value>) -> Vec<i64> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_i64()).collect(),
        _ => Vec::new(),
    }
}

impl TextTokenizer {
    /// Load from an HF model directory.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::NotFound(format!(
                "{}: no tokenizer.json (the model directory needs one to turn text into tokens)",
                dir.display()
            )));
        }
        let inner = Tokenizer::from_file(&path)
            .map_err(|e| ModelError::bad(&path, format!("tokenizer does not parse: {e}")))?;
        let tc = read_json(&dir.join("tokenizer_config.json"))?;
        let gen = read_json(&dir.join("generation_config.json"))?;
        let cfg = read_json(&dir.join("config.json"))?;
        let chat_template = tc.as_ref().and_then(|tc| match tc.get("chat_template")? {
            serde_json::Value::String(s) => Some(s.clone()),
            // A list of named templates: take "default".
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
            _ => None,
        });
        let chat_template =
            chat_template.or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        let bos_token = tc.as_ref().and_then(|tc| token_string(tc.get("bos_token")));
        let eos_token = tc.as_ref().and_then(|tc| token_string(tc.get("eos_token")));
        let mut eos_ids: BTreeSet<i64> = BTreeSet::new();
        eos_ids.extend(id_list(gen.as_ref().and_then(|g| g.get("eos_token_id"))));
        eos_ids.extend(id_list(cfg.as_ref().and_then(|g| g.get("eos_token_id"))));
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.insert(id as i64);
        }
        let pad_id = tc
            .as_ref()
            .and_then(|tc| token_string(tc.get("pad_token")))
            .and_then(|t| inner.token_to_id(&t))
            .map(|i| i as i64);
        Ok(TextTokenizer {
            inner,
            chat_template,
            bos_token,
            eos_token,
            eos_ids,
            pad_id,
            source: path,
            backtick: std::sync::OnceLock::new(),
        })
    }

    /// Token ids of `text`, with the tokenizer's own special-token rules
    /// (e.g. a BOS for Llama-style tokenizers).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>, ModelError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::bad(&self.source, format!("encoding failed: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// Token ids of `text` with the byte offsets `(start, end)` of each token.
    pub fn encode_with_offsets(&self, text: &str) -> Result<TokensWithOffsets, ModelError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::bad(&self.source, format!("encoding failed: {e}")))?;
        Ok((
            enc.get_ids().iter().map(|&i| i as i64).collect(),
            enc.get_offsets().to_vec(),
        ))
    }

    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String, ModelError> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.inner
            .decode(&ids, skip_special_tokens)
            .map_err(|e| ModelError::bad(&self.source, format!("decoding failed: {e}")))
    }

    /// Could token `id` put a backtick into decoded text? A code fence
    /// needs one, so a generation that only watches for its code block to
    /// close decodes the text again only after such a token. Each id is
    /// decoded alone, special tokens included: a backtick is one ASCII byte,
    /// so the token whose bytes hold it shows it decoded alone too, and an
    /// id that fails to decode counts as holding one.
    pub fn may_hold_backtick(&self, id: i64) -> bool {
        let table = self.backtick.get_or_init(|| {
            (0..self.inner.get_vocab_size(true) as u32)
                .map(|i| {
                    self.inner
                        .decode(&[i], false)
                        .map_or(true, |t| t.contains('`'))
                })
                .collect()
        });
        usize::try_from(id)
            .ok()
            .and_then(|i| table.get(i).copied())
            .unwrap_or(true)
    }

    /// Ids that end a completion.
    pub fn eos_ids(&self) -> &BTreeSet<i64> {
        &self.eos_ids
    }

    /// Id used to left-pad ragged batches (never attended to).
    pub fn pad_id(&self) -> i64 {
        self.pad_id
            .or_else(|| self.eos_ids.iter().next().copied())
            .unwrap_or(0)
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Render `messages` with the model's chat template, as
    /// `apply_chat_template(..., tokenize=False)` does.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let tpl = self.chat_template.as_deref().ok_or_else(|| {
            ModelError::bad(
                &self.source,
                "the model has no chat template (tokenizer_config.json `chat_template`)",
            )
        })?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", tpl).map_err(|e| {
            ModelError::bad(&self.source, format!("chat template does not parse: {e}"))
        })?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        env.get_template("chat")
            .and_then(|t| t.render(ctx))
            .map_err(|e| ModelError::bad(&self.source, format!("chat template failed: {e}")))
    }
}
