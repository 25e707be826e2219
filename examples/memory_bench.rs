//! Long-term memory speed, the Rust side of `scripts/bench/run memory`: top-10
//! search over the vectors in DATA (raw little-endian f32, `n × dim`) with the
//! exact index and a FAISS IVF index, single queries and batches, plus the
//! insert of 10k entries with the hash embedder and one SQLite commit.
//! Prints one JSON object. Usage:
//!   memory_bench DATA QUERIES --dim 384 [--batch 64] [--nlist 1024] [--nprobe 16] [--threads 2]
use std::path::PathBuf;
use std::time::Instant;

use falcon_rl::exec::ExecReport;
use falcon_rl::memory::long_term::LongTermRecord;
use falcon_rl::memory::{ExactIndex, HashEmbedder, LongTerm, VectorIndex};
use tch::{Device, Tensor};

fn read_f32(path: &PathBuf, dim: i64) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Tensor::from_slice(&v).view([-1, dim])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time_index(idx: &mut dyn VectorIndex, q: &Tensor, batch: i64) -> (f64, f64, Vec<Vec<i64>>) {
    let nq = q.size()[0];
    idx.search(&q.narrow(0, 0, 1), 10).unwrap(); // warm-up
    let mut single = Vec::new();
    let mut ids = Vec::new();
    for i in 0..nq {
        let t = Instant::now();
        let h = idx.search(&q.narrow(0, i, 1), 10).unwrap();
        single.push(t.elapsed().as_secs_f64());
        ids.push(h[0].iter().map(|x| x.id).collect());
    }
    let t = Instant::now();
    let mut done = 0;
    while done < nq {
        let b = batch.min(nq - done);
        idx.search(&q.narrow(0, done, b), 10).unwrap();
        done += b;
    }
    let batch_s = t.elapsed().as_secs_f64() * batch as f64 / nq as f64;
    (median(single), batch_s, ids)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut pos = Vec::new();
    let (mut dim, mut batch, mut nlist, mut nprobe, mut threads) =
        (384i64, 64i64, 1024usize, 16usize, 2i32);
    let mut i = 1;
    while i < args.len() {
        let next = || args[i + 1].clone();
        match args[i].as_str() {
            "--dim" => dim = next().parse().unwrap(),
            "--batch" => batch = next().parse().unwrap(),
            "--nlist" => nlist = next().parse().unwrap(),
            "--nprobe" => nprobe = next().parse().unwrap(),
            "--threads" => threads = next().parse().unwrap(),
            p => {
                pos.push(PathBuf::from(p));
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    tch::set_num_threads(threads);
    let data = read_f32(&pos[0], dim);
    let queries = read_f32(&pos[1], dim);
    let n = data.size()[0];
    let ids: Vec<i64> = (0..n).collect();

    let t = Instant::now();
    let mut exact = ExactIndex::new(dim as usize, Device::Cpu);
    exact.add(&ids, &data).unwrap();
    let exact_build = t.elapsed().as_secs_f64();
    let (exact_single, exact_batch, truth) = time_index(&mut exact, &queries, batch);

    let mut out = serde_json::json!({
        "n": n, "dim": dim, "queries": queries.size()[0], "batch": batch, "threads": threads,
        "exact": {"build_s": exact_build, "single_s": exact_single, "batch_s": exact_batch},
    });

    {
        use falcon_rl::memory::FaissIndex;
        let t = Instant::now();
        // Train on a 50k sample (≈ 49 per list at nlist 1024), then add all.
        let train = 50_000.min(n as usize);
        let mut ivf = FaissIndex::new(
            dim as usize,
            &format!("IVF{nlist},Flat"),
            Some(nprobe),
            train,
        )
        .unwrap();
        let mut start = 0;
        while start < n {
            let b = 100_000.min(n - start);
            ivf.add(
                &ids[start as usize..(start + b) as usize],
                &data.narrow(0, start, b),
            )
            .unwrap();
            start += b;
        }
        let build = t.elapsed().as_secs_f64();
        let (single, batch_s, got) = time_index(&mut ivf, &queries, batch);
        let mut found = 0usize;
        for (a, b) in truth.iter().zip(&got) {
            found += a.iter().filter(|x| b.contains(x)).count();
        }
        let recall = found as f64 / (truth.len() * 10) as f64;
        out["faiss_ivf"] = serde_json::json!({
            "nlist": nlist, "nprobe": nprobe, "build_s": build, "single_s": single,
            "batch_s": batch_s, "recall_at_10": recall,
        });
    }

    // Insert 10k entries: hash embedding, one SQLite transaction, index add.
    let dir = tempfile::tempdir().unwrap();
    let emb = HashEmbedder::new(384).unwrap();
    let mut lt = LongTerm::open(
        dir.path(),
        &emb,
        Box::new(ExactIndex::new(384, Device::Cpu)),
    )
    .unwrap();
    let batch_in: Vec<LongTermRecord> = (0..10_000)
        .map(|i| {
            LongTermRecord::new(
                i / 100,
                format!("task/{i}"),
                format!("Write a function number {i} that sorts a list of {} integers and returns the median.", i % 97),
                format!("def f(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]  # {i}\n"),
                ExecReport::no_signal("bench"),
                Default::default(),
            )
        })
        .collect();
    let t = Instant::now();
    lt.insert(&emb, batch_in).unwrap();
    out["insert_10k_s"] = serde_json::json!(t.elapsed().as_secs_f64());
    println!("{out}");
}
