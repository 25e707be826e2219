//! The tokenizer files (`tokenizer.json`, `tokenizer_config.json`) rebuilt
//! from a GGUF file's `tokenizer.ggml.*` metadata, as `transformers`
//! rebuilds them.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::file::*;
use super::GgufError;

/// Special token ids from `tokenizer.ggml.*`.
pub(super) struct SpecialIds {
    pub(super) bos: Option<u64>,
    pub(super) eos: Option<u64>,
    pub(super) unk: Option<u64>,
    pub(super) pad: Option<u64>,
}

pub(super) fn read_special_ids(g: &GgufFile) -> Result<SpecialIds, GgufError> {
    Ok(SpecialIds {
        bos: g.opt_u64("tokenizer.ggml.bos_token_id")?,
        eos: g.opt_u64("tokenizer.ggml.eos_token_id")?,
        unk: g.opt_u64("tokenizer.ggml.unknown_token_id")?,
        pad: g.opt_u64("tokenizer.ggml.padding_token_id")?,
    })
}

/// The three tokenizer files, rendered.
pub(super) struct TokenizerFiles {
    pub(super) tokenizer_json: String,
    pub(super) tokenizer_config: Value,
    pub(super) special_tokens_map: Value,
    pub(super) vocab_len: Option<u64>,
}

/// llama.cpp token types (`tokenizer.ggml.token_type`).
pub(super) const TOKEN_TYPE_CONTROL: i64 = 3;
pub(super) const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// GPT-2's reversible byte-to-character table: printable bytes stand for themselves, the rest
/// are shifted to code points from 256 up, in byte order.
pub(super) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            let c = next;
            next += 1;
            c
        };
        *slot = char::from_u32(code).unwrap_or('\u{fffd}');
    }
    table
}

/// Rebuilds the tokenizer the way transformers does for a GGUF (see
/// `transformers/integrations/gguf/gguf_tokenizer_mapping.py`): a GPT-2 style byte-level BPE
/// whose pre-tokenizer regex is swapped for a few known `tokenizer.ggml.pre` values, control
/// tokens added as special tokens and user-defined ones as plain added tokens.
pub(super) fn build_tokenizer_files(
    g: &GgufFile,
    ids: &SpecialIds,
) -> Result<TokenizerFiles, GgufError> {
    let model = g.opt_str("tokenizer.ggml.model")?;
    match model {
        Some("gpt2") => {}
        Some(other) => {
            return Err(GgufError::Unsupported {
                path: g.path.clone(),
                what: format!(
                    "tokenizer model '{other}' (only 'gpt2' byte-level BPE is converted)"
                ),
            })
        }
        None => {
            return Err(GgufError::MissingMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.model".into(),
            })
        }
    }
    let tokens =
        g.opt_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| GgufError::MissingMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.tokens".into(),
            })?;
    let merges =
        g.opt_str_array("tokenizer.ggml.merges")?
            .ok_or_else(|| GgufError::MissingMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.merges".into(),
            })?;
    let token_types = g.opt_int_array("tokenizer.ggml.token_type")?;
    if let Some(tt) = &token_types {
        if tt.len() != tokens.len() {
            return Err(GgufError::BadMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.token_type".into(),
                expected: "one entry per token",
                found: format!("{} entries for {} tokens", tt.len(), tokens.len()),
            });
        }
    }
    let token_at = |key: &str, id: Option<u64>| -> Result<Option<&str>, GgufError> {
        match id {
            None => Ok(None),
            Some(id) => usize::try_from(id)
                .ok()
                .and_then(|i| tokens.get(i).copied())
                .map(Some)
                .ok_or_else(|| GgufError::BadMetadata {
                    path: g.path.clone(),
                    key: key.into(),
                    expected: "a token id within the vocabulary",
                    found: format!("{id} (vocabulary has {} tokens)", tokens.len()),
                }),
        }
    };
    let bos = token_at("tokenizer.ggml.bos_token_id", ids.bos)?;
    let eos = token_at("tokenizer.ggml.eos_token_id", ids.eos)?;
    let unk = token_at("tokenizer.ggml.unknown_token_id", ids.unk)?;
    let pad = token_at("tokenizer.ggml.padding_token_id", ids.pad)?;
    let add_bos = g.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = g.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let pre = g.opt_str("tokenizer.ggml.pre")?;
    let chat_template = g.opt_str("tokenizer.chat_template")?;

    // Vocabulary entries are spelled in the byte alphabet; a token written in plain text
    // (outside that alphabet) is respelled from its UTF-8 bytes, as transformers does.
    let table = byte_to_char_table();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    let spelled = |t: &str| -> String {
        if t.chars().all(|c| alphabet.contains(&c)) {
            t.to_string()
        } else {
            t.bytes().map(|b| table[b as usize]).collect()
        }
    };
    // A JSON object keeps the last id of a duplicated token, as a Python dict would.
    let mut vocab = Map::new();
    for (id, t) in tokens.iter().enumerate() {
        vocab.insert(spelled(t), json!(id));
    }
    let merges_json: Vec<Value> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => json!([a, b]),
            None => json!([m, ""]),
        })
        .collect();

    // Added tokens, in the order transformers adds them: control tokens (special), then
    // user-defined ones (not special). A control token outside the byte alphabet is a llama.cpp
    // mislabel that transformers skips, and so do we.
    let mut added: Vec<(usize, &str, bool)> = Vec::new();
    let mut added_ids = HashSet::new();
    if let Some(tt) = &token_types {
        for (id, (t, &ty)) in tokens.iter().zip(tt).enumerate() {
            if ty == TOKEN_TYPE_CONTROL
                && t.chars().all(|c| alphabet.contains(&c))
                && added_ids.insert(id)
            {
                added.push((id, t, true));
            }
        }
        for (id, (t, &ty)) in tokens.iter().zip(tt).enumerate() {
            if ty == TOKEN_TYPE_USER_DEFINED && vocab.contains_key(*t) && added_ids.insert(id) {
                added.push((id, t, false));
            }
        }
    }
    // transformers also registers bos/eos/unk/pad as special tokens.
    for id in [ids.bos, ids.eos, ids.unk, ids.pad] {
        if let Some(id) = id.and_then(|i| usize::try_from(i).ok()) {
            if let Some(t) = tokens.get(id) {
                if added_ids.insert(id) {
                    added.push((id, t, true));
                }
            }
        }
    }
    added.sort_by_key(|a| a.0);
    let added_json: Vec<Value> = added
        .iter()
        .map(|&(id, content, special)| {
            json!({
                "id": id,
                "content": content,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": special,
            })
        })
        .collect();

    let byte_level = |use_regex: bool| {
        json!({
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": true,
            "use_regex": use_regex,
        })
    };
    let pre_tokenizer = match pre.and_then(split_regex_for) {
        Some(regex) => json!({
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": regex},
                    "behavior": "Isolated",
                    "invert": false,
                },
                byte_level(false),
            ],
        }),
        None => byte_level(true),
    };
    let post_processor = template_post_processor(
        if add_bos { bos.zip(ids.bos) } else { None },
        if add_eos { eos.zip(ids.eos) } else { None },
    );

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_json,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": true,
            "trim_offsets": true,
            "use_regex": true,
        },
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges_json,
        },
    });

    let mut decoder = Map::new();
    for &(id, content, special) in &added {
        decoder.insert(
            id.to_string(),
            json!({
                "content": content,
                "lstrip": false,
                "normalized": false,
                "rstrip": false,
                "single_word": false,
                "special": special,
            }),
        );
    }
    let mut config = Map::new();
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    config.insert("added_tokens_decoder".into(), Value::Object(decoder));
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    let mut special_map = Map::new();
    for (name, token) in [
        ("bos_token", bos),
        ("eos_token", eos),
        ("unk_token", unk),
        ("pad_token", pad),
    ] {
        config.insert(name.into(), json!(token));
        if let Some(t) = token {
            special_map.insert(name.into(), json!(t));
        }
    }
    if let Some(t) = chat_template {
        config.insert("chat_template".into(), json!(t));
    }
    config.insert("tokenizer_class".into(), json!("TokenizersBackend"));
    let extra: Vec<&str> = added
        .iter()
        .filter(|a| a.2)
        .map(|a| a.1)
        .filter(|t| ![bos, eos, unk, pad].contains(&Some(*t)))
        .collect();
    if !extra.is_empty() {
        special_map.insert("additional_special_tokens".into(), json!(extra));
    }

    Ok(TokenizerFiles {
        tokenizer_json: tokenizer.to_string(),
        tokenizer_config: Value::Object(config),
        special_tokens_map: Value::Object(special_map),
        vocab_len: Some(tokens.len() as u64),
    })
}

/// The `TemplateProcessing` transformers' `update_post_processor` builds: `[bos] $A [eos]` for a
/// single sequence and the same followed by `[bos] $B [eos]` (type id 1) for a pair.
pub(super) fn template_post_processor(bos: Option<(&str, u64)>, eos: Option<(&str, u64)>) -> Value {
    let part = |type_id: u32, seq: &str| -> Vec<Value> {
        let tok = |t: &str| json!({"SpecialToken": {"id": t, "type_id": type_id}});
        let mut out = Vec::new();
        if let Some((t, _)) = bos {
            out.push(tok(t));
        }
        out.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some((t, _)) = eos {
            out.push(tok(t));
        }
        out
    };
    let single = part(0, "A");
    let pair: Vec<Value> = single.iter().cloned().chain(part(1, "B")).collect();
    let mut special = Map::new();
    for (t, id) in bos.into_iter().chain(eos) {
        special.insert(t.into(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": special,
    })
}

/// The split regex transformers substitutes for a `tokenizer.ggml.pre` value, if any. Values
/// not listed (e.g. SmolLM2's `smollm`) keep GPT-2's ByteLevel regex.
pub(super) fn split_regex_for(pre: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2,
        "qwen35" => QWEN35,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O,
        "tekken" => TEKKEN,
        _ => return None,
    })
}
