//! The vLLM engine behind the [`Generator`] seam: a managed server or given
//! URLs, kept on the policy's weights (LoRA adapters or full weights, per
//! version), generating from the policy's own token ids; a background
//! generation for overlap, and a meta-step's per-task fast adapters.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::with_log;
use super::*;
use crate::config::VllmConfig;
use crate::model::generate::encode_prompts;
use crate::model::TextTokenizer;
use crate::model::{Completion, GenerationParams, Generator, ModelError, Policy};

/// One entry of [`VllmEngine::generate_adapted`]: fast weights (LoRA
/// factors by VarStore name), the prompt, and the entry's seed.
pub type FastRow<'a> = (&'a [(String, tch::Tensor)], &'a str, u64);

/// A generation running in the background ([`VllmEngine::spawn_generate`]).
pub struct Pending {
    handle: std::thread::JoinHandle<Result<Vec<Completion>, ModelError>>,
}

impl Pending {
    /// Wait for the completions.
    pub fn wait(self) -> Result<Vec<Completion>, ModelError> {
        self.handle.join().unwrap_or_else(|_| {
            Err(ModelError::Invalid(
                "the background generation panicked".into(),
            ))
        })
    }
}

/// The vLLM engine: a managed server or given URLs, the model name requests
/// use, and which policy version the servers hold.
pub struct VllmEngine {
    server: Option<VllmServer>,
    /// How the managed server was started, to start it again.
    spec: Option<ServerSpec>,
    client: VllmClient,
    tokenizer: TextTokenizer,
    /// Where adapters and full weights for the servers are written.
    work: PathBuf,
    /// The base model's served name.
    base: String,
    /// Adapters loaded beside the policy's (a meta-step's fast weights).
    extra: Vec<(String, PathBuf)>,
    /// The adapter requests name (LoRA), with its directory.
    adapter: Option<(String, PathBuf)>,
    /// Earlier adapters still loaded (newest last): a generation in flight
    /// may still use them.
    retired: std::collections::VecDeque<(String, PathBuf)>,
    /// How many earlier adapters stay loaded (1 with overlap).
    keep_previous: usize,
    lora: bool,
    synced: Option<u64>,
}

impl std::fmt::Debug for VllmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VllmEngine")
            .field("urls", &self.client.urls())
            .field("managed", &self.server.is_some())
            .field("adapter", &self.adapter)
            .field("synced", &self.synced)
            .finish()
    }
}

impl VllmEngine {
    /// Start (managed) or reach (`urls`) the servers for `policy`, with
    /// `work` for what the servers read (base model, adapters, weights) and
    /// `log` for a managed server's output. A managed server for full
    /// fine-tuning starts with `policy`'s weights, as `version`; otherwise
    /// the servers hold no policy version until [`VllmEngine::sync`].
    /// `adapters`: how many adapters one batch mixes (a meta-step's K fast
    /// adapters and the policy's).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: &VllmConfig,
        policy: &Policy,
        version: u64,
        adapters: usize,
        work: &Path,
        log: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Self, ModelError> {
        let lora = policy.lora.is_some();
        let tied = policy.hf_config.get("tie_word_embeddings") == Some(&Value::Bool(true));
        if !lora && tied {
            // Measured here: after `reload_weights` vLLM 0.32 logs
            // "ParallelLMHead: Failed to load weights" and keeps the old
            // output layer, so every step would sample from stale logits.
            return Err(ModelError::Invalid(
                "full fine-tuning of a model with tied input/output embeddings \
                 (tie_word_embeddings) cannot sync to vLLM 0.32: its weight reload leaves the \
                 tied output layer stale; enable [model.lora] or use the native engine"
                    .into(),
            ));
        }
        let tokenizer = policy.tokenizer()?.clone();
        std::fs::create_dir_all(work).map_err(|e| ModelError::io(work, e))?;
        // Absolute, because the server resolves paths from its own cwd.
        let work = std::fs::canonicalize(work).map_err(|e| ModelError::io(work, e))?;
        let timeout = Duration::from_secs(cfg.request_timeout_s);
        let (server, client, base) = if cfg.managed() {
            let dir = work.join(if lora { "base" } else { "weights" });
            progress(&format!("writing the model for vLLM to {}", dir.display()));
            if lora {
                crate::model::export::export_hf_base(policy, &dir, policy.dtype, true)?;
            } else {
                crate::model::export::export_hf(policy, &dir, policy.dtype, true)?;
            }
            let spec = ServerSpec::from_config(cfg, policy, adapters, &dir, log);
            progress(&format!(
                "starting vLLM ({} {}); log {}",
                spec.python.display(),
                spec.args(0)[1],
                log.display()
            ));
            let t0 = Instant::now();
            let server = VllmServer::start(&spec, progress)?;
            progress(&format!(
                "vLLM ready at {} in {:.0} s",
                server.url(),
                t0.elapsed().as_secs_f64()
            ));
            let client = VllmClient::new(
                &[server.url().to_owned()],
                timeout,
                cfg.max_parallel_requests,
            );
            (Some((server, spec)), client, BASE_NAME.to_owned())
        } else {
            let client = VllmClient::new(&cfg.urls, timeout, cfg.max_parallel_requests);
            let models = client.models()?;
            let base = models.first().cloned().ok_or_else(|| {
                ModelError::Invalid(format!("{}: serves no model", client.urls()[0]))
            })?;
            (None, client, base)
        };
        let synced = (server.is_some() && !lora).then_some(version);
        let on_cpu = !policy.device().is_cuda();
        let client = client.seeded(cfg.seed_requests.unwrap_or(!(cfg.managed() && on_cpu)));
        let (server, spec) = server.unzip();
        Ok(VllmEngine {
            server,
            spec,
            client,
            tokenizer,
            work,
            base,
            extra: Vec::new(),
            adapter: None,
            retired: Default::default(),
            keep_previous: 0,
            lora,
            synced,
        })
    }

    /// The managed server, if falcon started one.
    pub fn server(&mut self) -> Option<&mut VllmServer> {
        self.server.as_mut()
    }

    /// The servers' base URLs.
    pub fn urls(&self) -> &[String] {
        self.client.urls()
    }

    /// The model name requests name: the current adapter, else the base.
    pub fn model_name(&self) -> &str {
        self.adapter
            .as_ref()
            .map(|a| a.0.as_str())
            .unwrap_or(&self.base)
    }

    /// The policy version the servers hold.
    pub fn synced(&self) -> Option<u64> {
        self.synced
    }

    /// Bring the servers to `policy` as version `version`, unless they
    /// already hold it; returns the seconds it took (0 when nothing was
    /// done). LoRA: the adapter is written to a new directory under a new
    /// name, loaded, and the previous one unloaded and deleted, so no stale
    /// prefix-cache block or adapter outlives its step. Full weights: a
    /// merged directory reloaded in place, and the prefix cache reset.
    /// A managed server found dead here is started again once.
    pub fn sync(&mut self, policy: &Policy, version: u64) -> Result<f64, ModelError> {
        if self.synced == Some(version) {
            return Ok(0.0);
        }
        let t0 = Instant::now();
        match self.sync_now(policy, version) {
            Ok(secs) => Ok(secs),
            Err(e) if !self.server_died() => Err(e),
            Err(_) => {
                self.restart(policy, version)?;
                Ok(t0.elapsed().as_secs_f64())
            }
        }
    }

    /// Whether falcon's own server has died.
    fn server_died(&mut self) -> bool {
        self.server.as_mut().is_some_and(|s| !s.alive())
    }

    fn sync_now(&mut self, policy: &Policy, version: u64) -> Result<f64, ModelError> {
        let t0 = Instant::now();
        if self.lora {
            let name = format!("policy-v{version}");
            let dir = self.work.join("adapters").join(&name);
            crate::model::export::export_peft(policy, &dir, true)?;
            self.client.load_adapter(&name, &dir)?;
            if let Some(old) = self.adapter.replace((name, dir)) {
                self.retired.push_back(old);
            }
            while self.retired.len() > self.keep_previous {
                let (old, old_dir) = self.retired.pop_front().expect("non-empty");
                self.client.unload_adapter(&old)?;
                let _ = std::fs::remove_dir_all(old_dir);
            }
        } else {
            let dir = self.work.join("weights");
            crate::model::export::export_hf(policy, &dir, policy.dtype, true)?;
            self.client.reload_weights(&dir)?;
        }
        self.synced = Some(version);
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Generate from the servers; a managed server found dead is started
    /// again once (same port, so the client's URL holds), brought to
    /// `policy` as `version`, and asked again. An error from a server that
    /// lives, or from the second try, is returned.
    pub fn generate_or_restart(
        &mut self,
        policy: &Policy,
        version: u64,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        if !self.server_died() {
            match self.generate(prompts, params) {
                Ok(c) => return Ok(c),
                Err(e) if !self.server_died() => return Err(e),
                Err(_) => {}
            }
        }
        self.restart(policy, version)?;
        self.generate(prompts, params)
    }

    /// A managed server's log.
    fn log(&self) -> Option<&Path> {
        self.server.as_ref().map(VllmServer::log)
    }

    /// Start a dead managed server again, at the same port, and bring it
    /// to `policy` as `version`.
    fn restart(&mut self, policy: &Policy, version: u64) -> Result<(), ModelError> {
        let (Some(server), Some(spec)) = (self.server.take(), self.spec.as_mut()) else {
            unreachable!("only a managed server is found dead")
        };
        let why = server.failed("died");
        // The port it had, so requests keep their URL.
        spec.port = server
            .url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        drop(server);
        eprintln!("falcon: {why}; starting it again (once)");
        let server = VllmServer::start(spec, &mut |m| eprintln!("falcon: {m}"))
            .map_err(|e| ModelError::Invalid(format!("{why}; starting it again failed: {e}")))?;
        self.server = Some(server);
        self.adapter = None;
        self.retired.clear();
        self.synced = None;
        self.sync_now(policy, version).map(|_| ())
    }
}

impl VllmEngine {
    /// Keep the `n` adapters before the current one loaded: a generation
    /// started with one of them (overlap) finishes after the next sync.
    pub fn keep_previous(&mut self, n: usize) {
        self.keep_previous = n;
    }

    /// [`Generator::generate`] on a thread of its own, with the adapter the
    /// servers hold now: the trainer updates meanwhile (one-step off-policy).
    pub fn spawn_generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Pending, ModelError> {
        let ids = self.encode(prompts, params)?;
        let client = self.client.clone();
        let model = self.model_name().to_owned();
        let params = params.clone();
        let log = self.log().map(Path::to_path_buf);
        let tok = self.tokenizer.clone();
        let handle = std::thread::spawn(move || {
            let comps = client
                .complete_all(&model, &ids, &params)
                .map_err(|e| with_log(e, log.as_deref()))?;
            cut_all(comps, &tok, &params)
        });
        Ok(Pending { handle })
    }

    /// Token ids of `prompts` as the servers get them.
    pub fn encode(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Vec<i64>>, ModelError> {
        encode_prompts(&self.tokenizer, prompts, params)
    }

    /// Load `fast` (LoRA factors by VarStore name, e.g. a MAML task's θ_i)
    /// over the policy's other adapters as adapter `name`, until
    /// [`VllmEngine::unload_extra`].
    pub fn load_extra(
        &mut self,
        policy: &Policy,
        fast: &[(String, tch::Tensor)],
        name: &str,
    ) -> Result<(), ModelError> {
        let dir = self.work.join("fast").join(name);
        crate::model::export::export_peft_with(policy, fast, &dir, true)?;
        self.client.load_adapter(name, &dir)?;
        self.extra.push((name.to_owned(), dir));
        Ok(())
    }

    /// Unload and delete every adapter [`VllmEngine::load_extra`] loaded.
    pub fn unload_extra(&mut self) -> Result<(), ModelError> {
        for (name, dir) in std::mem::take(&mut self.extra) {
            self.client.unload_adapter(&name)?;
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }

    /// One completion per row (served name, prompt ids, seed), all in
    /// flight together.
    pub fn generate_rows(
        &self,
        rows: &[Row],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let comps = self
            .client
            .complete_rows(rows, params)
            .map_err(|e| with_log(e, self.log()))?;
        cut_all(comps, &self.tokenizer, params)
    }

    /// `n` completions of each `(fast, prompt, seed)`: every fast weight
    /// set (a MAML task's θ_i) loaded as its own adapter, all rows sent
    /// together so the servers batch the adapters at once (row `j` of an
    /// entry seeded from its `seed` by [`row_seed`]), then unloaded. In
    /// entry order, `n` per entry; `tag` names the adapters.
    pub fn generate_adapted(
        &mut self,
        policy: &Policy,
        each: &[FastRow],
        n: usize,
        params: &GenerationParams,
        tag: &str,
    ) -> Result<Vec<Completion>, ModelError> {
        let mut names = Vec::with_capacity(each.len());
        let mut ids = Vec::with_capacity(each.len());
        for (k, (fast, prompt, _)) in each.iter().enumerate() {
            let name = format!("fast-{tag}-t{k}");
            self.load_extra(policy, fast, &name)?;
            names.push(name);
            ids.push(self.encode(&[prompt.to_string()], params)?);
        }
        let mut rows = Vec::with_capacity(each.len() * n);
        for (k, (_, _, seed)) in each.iter().enumerate() {
            for j in 0..n {
                rows.push(Row {
                    model: &names[k],
                    prompt: &ids[k][0],
                    seed: Some(row_seed(*seed, j as u64)),
                });
            }
        }
        let comps = self.generate_rows(&rows, params);
        let unloaded = self.unload_extra();
        let comps = comps?;
        unloaded?;
        Ok(comps)
    }
}

/// The servers know stop strings but not the end of a code block: cut
/// each completion there afterwards, with its token ids and log-probs.
fn cut_all(
    comps: Vec<Completion>,
    tok: &TextTokenizer,
    params: &GenerationParams,
) -> Result<Vec<Completion>, ModelError> {
    comps
        .into_iter()
        .map(|c| crate::model::generate::cut_at_block_end(c, Some(tok), params))
        .collect()
}

impl Generator for VllmEngine {
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let ids = self.encode(prompts, params)?;
        let comps = self
            .client
            .complete_all(self.model_name(), &ids, params)
            .map_err(|e| with_log(e, self.log()))?;
        cut_all(comps, &self.tokenizer, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Dtype;

    #[test]
    fn full_weights_of_a_tied_model_are_refused_before_a_server_starts() {
        let d = std::env::temp_dir().join(format!("falcon-vllm-tied-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let config = crate::model::testing::tiny_llama_config(1, 16, 64, 64);
        crate::model::generate::write_random_model(&d, &config, 1, 0.3).unwrap();
        let policy = Policy::load(&d, Dtype::Fp32, tch::Device::Cpu).unwrap();
        let e = VllmEngine::start(
            &VllmConfig::default(),
            &policy,
            0,
            1,
            &d.join("work"),
            &d.join("server.log"),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("tie_word_embeddings"), "{e}");
        assert!(
            !d.join("work").exists(),
            "nothing written for a refused engine"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
