//! A [`Generator`] over an OpenAI-compatible server (vLLM, TGI, SGLang,
//! llama.cpp, the OpenAI API): one blocking `POST {base_url}/v1/chat/completions`
//! per prompt, through `ureq`.
//!
//! The server returns text only, so every [`Completion`] has empty
//! `prompt_ids`, `token_ids` and `logprobs`: use this generator for the
//! reflector and LM judges, never for policy rollouts that are trained on.
//!
//! The server applies its own chat template, so `GenerationParams::chat` has
//! no effect; `system` becomes a system message, and a `prefill` the start
//! of the assistant's message, which the server continues
//! (`continue_final_message`, a vLLM/SGLang extension; the answer holds only
//! the continuation, as vLLM returns it). `stop_at_block_end` cuts the
//! answer's text afterwards. `top_k` and `ignore_eos` are
//! sent only when set, as the vLLM/SGLang extensions of the same names; a
//! server that does not know them answers with an error, which is reported,
//! rather than silently sampling differently.
//!
//! `https://` URLs need the crate feature `tls`. The API key is read from the
//! environment variable the config names, and is never logged or put in an
//! error message.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{Completion, FinishReason, GenerationParams, Generator, ModelError};

/// How much of a response body an error message quotes.
const BODY_EXCERPT_CHARS: usize = 400;

pub use crate::config::OpenAiConfig;

/// The client. The key lives here only; `Debug` does not print it.
pub struct OpenAiGenerator {
    url: String,
    model: String,
    api_key: Option<String>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for OpenAiGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiGenerator")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl OpenAiGenerator {
    /// Checks the config and reads the API key. Fails when the URL is not
    /// `http(s)://`, when `https` is asked without the `tls` feature, when the
    /// timeout is 0, or when the named key variable is unset or empty.
    pub fn new(cfg: &OpenAiConfig) -> Result<Self, ModelError> {
        let base = cfg.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ModelError::Invalid(format!(
                "openai base_url {:?} must start with http:// or https://",
                cfg.base_url
            )));
        }
        if base.starts_with("https://") && !cfg!(feature = "tls") {
            return Err(ModelError::Invalid(format!(
                "openai base_url {:?} is https, but this build has no TLS: rebuild with `--features tls`",
                cfg.base_url
            )));
        }
        if cfg.model.trim().is_empty() {
            return Err(ModelError::Invalid("openai model name is empty".into()));
        }
        if cfg.timeout_secs == 0 {
            return Err(ModelError::Invalid(
                "openai timeout_secs must be > 0".into(),
            ));
        }
        let api_key = match &cfg.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => Some(k.trim().to_owned()),
                _ => {
                    return Err(ModelError::Invalid(format!(
                        "environment variable {var} (openai api_key_env) is not set or empty"
                    )))
                }
            },
        };
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(cfg.timeout_secs)))
            // Non-2xx answers are read, so the error can quote the server.
            .http_status_as_error(false)
            .build()
            .into();
        Ok(OpenAiGenerator {
            url: format!("{base}/v1/chat/completions"),
            model: cfg.model.clone(),
            api_key,
            agent,
        })
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The JSON request body for one prompt.
    fn request_body(&self, prompt: &str, params: &GenerationParams) -> Value {
        let mut messages = Vec::new();
        if let Some(system) = &params.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let prefilled = !params.prefill.is_empty();
        if prefilled {
            messages.push(json!({"role": "assistant", "content": params.prefill}));
        }
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.sampler.temperature.max(0.0),
            "top_p": params.sampler.top_p,
        });
        let obj = body.as_object_mut().expect("built as an object");
        if let Some(seed) = params.seed {
            obj.insert("seed".into(), json!(seed));
        }
        if !params.stop.is_empty() {
            obj.insert("stop".into(), json!(params.stop));
        }
        if params.sampler.top_k > 0 {
            obj.insert("top_k".into(), json!(params.sampler.top_k));
        }
        if params.ignore_eos {
            obj.insert("ignore_eos".into(), json!(true));
        }
        if prefilled {
            // vLLM's and SGLang's way to continue the last message.
            obj.insert("continue_final_message".into(), json!(true));
            obj.insert("add_generation_prompt".into(), json!(false));
        }
        body
    }

    fn complete(&self, prompt: &str, params: &GenerationParams) -> Result<Completion, ModelError> {
        let fail = |what: String| ModelError::Invalid(format!("POST {}: {what}", self.url));
        let body = self.request_body(prompt, params).to_string();
        let mut req = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            req = req.header("Authorization", &format!("Bearer {key}"));
        }
        let mut resp = req.send(body).map_err(|e| fail(transport_error(e)))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().map_err(|e| {
            fail(format!(
                "HTTP {status}, reading the body: {}",
                transport_error(e)
            ))
        })?;
        if !(200..300).contains(&status) {
            return Err(fail(format!("HTTP {status}: {}", excerpt(&text))));
        }
        let parsed: ChatResponse = serde_json::from_str(&text).map_err(|e| {
            fail(format!(
                "HTTP {status} but not a chat completion ({e}): {}",
                excerpt(&text)
            ))
        })?;
        let choice =
            parsed.choices.into_iter().next().ok_or_else(|| {
                fail(format!("HTTP {status} with no choices: {}", excerpt(&text)))
            })?;
        let c = Completion::text_only(
            choice.message.content.unwrap_or_default(),
            finish_reason(
                choice.finish_reason.as_deref(),
                choice.stop_reason.as_ref(),
                &params.stop,
            ),
        );
        super::generate::cut_at_block_end(c, None, params)
    }
}

impl Generator for OpenAiGenerator {
    /// One request per prompt, in order; the first failure ends the call.
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        prompts.iter().map(|p| self.complete(p, params)).collect()
    }
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
    #[serde(default)]
    finish_reason: Option<String>,
    /// vLLM's extension: the stop string (or token id) that ended the text.
    #[serde(default)]
    stop_reason: Option<Value>,
}

#[derive(Deserialize)]
struct Message {
    /// `null` when the server produced no text (e.g. cut off while reasoning).
    #[serde(default)]
    content: Option<String>,
}

/// OpenAI's `finish_reason` does not tell a stop string from end of
/// sequence; vLLM's `stop_reason` does, when it names one of ours. Reasons
/// with no counterpart (`content_filter`, `tool_calls`, absent) read as `Eos`.
pub(super) fn finish_reason(
    finish: Option<&str>,
    stop_reason: Option<&Value>,
    stops: &[String],
) -> FinishReason {
    match finish {
        Some("length") => FinishReason::Length,
        _ => match stop_reason.and_then(Value::as_str) {
            Some(s) if stops.iter().any(|x| x == s) => FinishReason::Stop(s.to_owned()),
            _ => FinishReason::Eos,
        },
    }
}

fn transport_error(e: ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        other => other.to_string(),
    }
}

/// The first characters of a body, on one line, for error messages.
fn excerpt(body: &str) -> String {
    crate::text::body_excerpt(body, BODY_EXCERPT_CHARS)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread::JoinHandle;

    use super::*;
    use crate::model::sampling::Sampler;

    /// One request as the mock server saw it.
    struct Seen {
        request_line: String,
        headers: Vec<String>,
        body: Value,
    }

    fn read_request(stream: &mut TcpStream) -> Seen {
        let mut reader = BufReader::new(stream);
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        let mut headers = Vec::new();
        let mut len = 0;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end().to_owned();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            headers.push(h);
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        Seen {
            request_line: request_line.trim_end().to_owned(),
            headers,
            body: serde_json::from_slice(&body).unwrap(),
        }
    }

    /// A one-thread HTTP server answering each connection with the next
    /// `(status, body)`; joins to the requests it saw.
    fn serve(replies: Vec<(u16, String)>) -> (String, JoinHandle<Vec<Seen>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for (status, body) in replies {
                let (mut stream, _) = listener.accept().unwrap();
                seen.push(read_request(&mut stream));
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
            seen
        });
        (url, handle)
    }

    #[test]
    fn a_prefill_is_the_assistant_message_the_server_continues() {
        let g = OpenAiGenerator::new(&config("http://127.0.0.1:9")).unwrap();
        let p = GenerationParams {
            prefill: "Plan 1:".into(),
            ..GenerationParams::default()
        };
        let body = g.request_body("plan it", &p);
        assert_eq!(
            body["messages"],
            json!([{"role": "user", "content": "plan it"}, {"role": "assistant", "content": "Plan 1:"}])
        );
        assert_eq!(body["continue_final_message"], json!(true));
        assert_eq!(body["add_generation_prompt"], json!(false));
        let plain = g.request_body("plan it", &GenerationParams::default());
        assert!(plain.get("continue_final_message").is_none());
        assert_eq!(plain["messages"].as_array().unwrap().len(), 1);
    }

    fn config(url: &str) -> OpenAiConfig {
        OpenAiConfig {
            base_url: url.to_owned(),
            model: "qwen-judge".into(),
            api_key_env: None,
            timeout_secs: 10,
        }
    }

    fn reply(content: &str, finish: &str, extra: &str) -> String {
        format!(
            r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":{}}},"finish_reason":"{finish}"{extra}}}],"usage":{{}}}}"#,
            serde_json::to_string(content).unwrap()
        )
    }

    #[test]
    fn success_sends_the_request_and_reads_the_choices() {
        let (url, server) = serve(vec![
            (200, reply("Score: 2", "stop", r#","stop_reason":"END""#)),
            (200, reply("Score: 1 and more", "length", "")),
        ]);
        // An always-set variable stands in for the key: set_var races other test threads.
        let key = std::env::var("PATH").unwrap();
        let g = OpenAiGenerator::new(&OpenAiConfig {
            api_key_env: Some("PATH".into()),
            base_url: format!("{url}/v1/"),
            ..config(&url)
        })
        .unwrap();
        assert_eq!(g.url(), format!("{url}/v1/chat/completions"));
        assert!(!format!("{g:?}").contains(&key));
        let params = GenerationParams {
            max_new_tokens: 64,
            sampler: Sampler {
                temperature: 0.7,
                top_k: 0,
                top_p: 0.95,
            },
            seed: Some(3),
            stop: vec!["END".into()],
            chat: true,
            system: Some("Be terse.".into()),
            ignore_eos: false,
            row_offset: 0,
            prefill: String::new(),
            stop_at_block_end: false,
        };
        let out = g
            .generate(&["first".into(), "second".into()], &params)
            .unwrap();
        assert_eq!(out[0].text, "Score: 2");
        assert_eq!(out[0].finish, FinishReason::Stop("END".into()));
        assert_eq!(out[1].finish, FinishReason::Length);
        assert!(
            out[0].token_ids.is_empty()
                && out[0].prompt_ids.is_empty()
                && out[0].logprobs.is_empty()
        );

        let seen = server.join().unwrap();
        assert_eq!(seen[0].request_line, "POST /v1/chat/completions HTTP/1.1");
        let auth = format!("authorization: bearer {}", key.trim()).to_ascii_lowercase();
        assert!(
            seen[0]
                .headers
                .iter()
                .any(|h| h.to_ascii_lowercase() == auth),
            "no Authorization header"
        );
        assert_eq!(
            seen[0].body,
            json!({
                "model": "qwen-judge",
                "messages": [
                    {"role": "system", "content": "Be terse."},
                    {"role": "user", "content": "first"},
                ],
                "max_tokens": 64,
                "temperature": 0.7,
                "top_p": 0.95,
                "seed": 3,
                "stop": ["END"],
            })
        );
        assert_eq!(seen[1].body["messages"][1]["content"], "second");
    }

    #[test]
    fn greedy_defaults_and_extensions_only_when_set() {
        let (url, server) = serve(vec![
            (200, reply("a", "stop", "")),
            (
                200,
                r#"{"choices":[{"message":{"content":null},"finish_reason":null}]}"#.into(),
            ),
        ]);
        let g = OpenAiGenerator::new(&config(&url)).unwrap();
        let out = g
            .generate(&["p".into()], &GenerationParams::default())
            .unwrap();
        assert_eq!(out[0].finish, FinishReason::Eos);
        let params = GenerationParams {
            sampler: Sampler {
                temperature: 1.0,
                top_k: 20,
                top_p: 1.0,
            },
            seed: None,
            ignore_eos: true,
            row_offset: 0,
            ..GenerationParams::default()
        };
        let out = g.generate(&["p".into()], &params).unwrap();
        assert_eq!(out[0].text, "");
        let seen = server.join().unwrap();
        assert!(!seen[0]
            .headers
            .iter()
            .any(|h| h.to_ascii_lowercase().starts_with("authorization")));
        let b0 = seen[0].body.as_object().unwrap();
        assert_eq!(b0["temperature"], 0.0);
        assert_eq!(b0["max_tokens"], 256);
        assert!(
            !b0.contains_key("stop") && !b0.contains_key("top_k") && !b0.contains_key("ignore_eos")
        );
        assert_eq!(b0["messages"], json!([{"role": "user", "content": "p"}]));
        let b1 = seen[1].body.as_object().unwrap();
        assert_eq!(
            (b1["top_k"].clone(), b1["ignore_eos"].clone()),
            (json!(20), json!(true))
        );
        assert!(!b1.contains_key("seed"));
    }

    #[test]
    fn http_500_names_the_url_status_and_body() {
        let (url, server) = serve(vec![(500, r#"{"error": "CUDA out of memory"}"#.into())]);
        let g = OpenAiGenerator::new(&config(&url)).unwrap();
        let err = g
            .generate(&["p".into()], &GenerationParams::default())
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ModelError::Invalid(_)));
        assert!(
            msg.contains(&format!("POST {url}/v1/chat/completions")),
            "{msg}"
        );
        assert!(
            msg.contains("HTTP 500") && msg.contains("CUDA out of memory"),
            "{msg}"
        );
        server.join().unwrap();
    }

    #[test]
    fn malformed_json_and_empty_choices_are_errors() {
        let long = format!("{{not json {}", "x".repeat(2000));
        let (url, server) = serve(vec![(200, long), (200, r#"{"choices": []}"#.into())]);
        let g = OpenAiGenerator::new(&config(&url)).unwrap();
        let msg = g
            .generate(&["p".into()], &GenerationParams::default())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("HTTP 200 but not a chat completion") && msg.contains("{not json"),
            "{msg}"
        );
        assert!(
            msg.len() < 1000,
            "the body is only excerpted: {} bytes",
            msg.len()
        );
        let msg = g
            .generate(&["p".into()], &GenerationParams::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no choices"), "{msg}");
        server.join().unwrap();
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            read_request(&mut stream);
            std::thread::sleep(Duration::from_secs(5));
        });
        let g = OpenAiGenerator::new(&OpenAiConfig {
            timeout_secs: 1,
            ..config(&url)
        })
        .unwrap();
        let t = std::time::Instant::now();
        let msg = g
            .generate(&["p".into()], &GenerationParams::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("timed out"), "{msg}");
        assert!(t.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn bad_configs_are_rejected_with_what_to_change() {
        let err = |cfg: OpenAiConfig| OpenAiGenerator::new(&cfg).unwrap_err().to_string();
        assert!(err(config("localhost:8000")).contains("must start with http://"));
        assert!(err(OpenAiConfig {
            timeout_secs: 0,
            ..config("http://h")
        })
        .contains("timeout_secs"));
        assert!(err(OpenAiConfig {
            model: " ".into(),
            ..config("http://h")
        })
        .contains("model name is empty"));
        let msg = err(OpenAiConfig {
            api_key_env: Some("FALCON_TEST_OPENAI_KEY_UNSET".into()),
            ..config("http://h")
        });
        assert!(msg.contains("FALCON_TEST_OPENAI_KEY_UNSET"), "{msg}");
        if !cfg!(feature = "tls") {
            assert!(err(config("https://api.example.com")).contains("--features tls"));
        }
        let cfg: OpenAiConfig =
            serde_json::from_str(r#"{"base_url": "http://h", "model": "m"}"#).unwrap();
        assert_eq!((cfg.timeout_secs, cfg.api_key_env), (120, None));
        assert!(serde_json::from_str::<OpenAiConfig>(
            r#"{"base_url": "http://h", "model": "m", "key": "x"}"#
        )
        .is_err());
    }
}
