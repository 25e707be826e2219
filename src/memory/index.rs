//! Vector indexes for long-term memory, behind [`VectorIndex`]: an exact
//! inner-product index whose vectors live on the device (libtorch matmul +
//! top-k; on CUDA when training runs there), and FAISS (feature `faiss`) for
//! IVF / HNSW indexes at large sizes and for saving to disk.
//!
//! Vectors are unit length (see `embed`), so inner product is cosine
//! similarity. Ids are the store's row ids: an index can always be rebuilt
//! from the store.

use tch::{Device, Kind, Tensor};

use super::MemoryError;

/// One search result: the entry's id and its inner product with the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub id: i64,
    pub score: f32,
}

/// Inner-product top-k search over `(id, vector)` pairs.
pub trait VectorIndex {
    fn dim(&self) -> usize;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Add `vectors` `[n, dim]` (any device; fp32 or convertible) under `ids`.
    fn add(&mut self, ids: &[i64], vectors: &Tensor) -> Result<(), MemoryError>;
    /// The `k` best hits of each query row of `queries` `[m, dim]`, best
    /// first (fewer when the index holds fewer than `k`).
    fn search(&mut self, queries: &Tensor, k: usize) -> Result<Vec<Vec<Hit>>, MemoryError>;
    /// What the index is, for logs and `falcon memory stats`.
    fn describe(&self) -> String;
}

fn check_shape(what: &str, t: &Tensor, dim: usize) -> Result<i64, MemoryError> {
    match t.size().as_slice() {
        [n, d] if *d == dim as i64 => Ok(*n),
        s => Err(MemoryError::Invalid(format!(
            "{what}: expected [n, {dim}] vectors, got shape {s:?}"
        ))),
    }
}

/// Exact search: every query is compared with every stored vector by one
/// matrix product on the index's device, then `topk`. Storage grows by
/// doubling so appends are amortised O(1) copies.
pub struct ExactIndex {
    dim: usize,
    device: Device,
    store: Tensor,
    ids: Vec<i64>,
}

impl ExactIndex {
    pub fn new(dim: usize, device: Device) -> Self {
        ExactIndex {
            dim,
            device,
            store: Tensor::zeros([0, dim as i64], (Kind::Float, device)),
            ids: Vec::new(),
        }
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The stored vectors `[len, dim]` (a view).
    pub fn vectors(&self) -> Tensor {
        self.store.narrow(0, 0, self.ids.len() as i64)
    }

    pub fn ids(&self) -> &[i64] {
        &self.ids
    }
}

impl VectorIndex for ExactIndex {
    fn dim(&self) -> usize {
        self.dim
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    fn add(&mut self, ids: &[i64], vectors: &Tensor) -> Result<(), MemoryError> {
        let n = check_shape("exact index add", vectors, self.dim)?;
        if n as usize != ids.len() {
            return Err(MemoryError::Invalid(format!(
                "exact index add: {} ids for {n} vectors",
                ids.len()
            )));
        }
        let len = self.ids.len() as i64;
        let cap = self.store.size()[0];
        if len + n > cap {
            let new_cap = (len + n).max(cap * 2).max(64);
            let bigger = Tensor::zeros([new_cap, self.dim as i64], (Kind::Float, self.device));
            if len > 0 {
                bigger
                    .narrow(0, 0, len)
                    .copy_(&self.store.narrow(0, 0, len));
            }
            self.store = bigger;
        }
        tch::no_grad(|| {
            self.store
                .narrow(0, len, n)
                .copy_(&vectors.to_kind(Kind::Float).to_device(self.device))
        });
        self.ids.extend_from_slice(ids);
        Ok(())
    }

    fn search(&mut self, queries: &Tensor, k: usize) -> Result<Vec<Vec<Hit>>, MemoryError> {
        let m = check_shape("exact index search", queries, self.dim)?;
        let k = k.min(self.ids.len());
        if k == 0 || m == 0 {
            return Ok(vec![Vec::new(); m as usize]);
        }
        let (scores, idx) = tch::no_grad(|| {
            let q = queries.to_kind(Kind::Float).to_device(self.device);
            // [n, d] · [d, m]: for one query this is a single matrix-vector
            // product over the stored rows, the bandwidth-bound best case.
            let s = self.vectors().matmul(&q.transpose(0, 1)).transpose(0, 1);
            s.topk(k as i64, 1, true, true)
        });
        let scores: Vec<f32> = Vec::try_from(scores.to_device(Device::Cpu).reshape([-1]))
            .map_err(|e| MemoryError::Invalid(format!("exact index: {e}")))?;
        let idx: Vec<i64> = Vec::try_from(idx.to_device(Device::Cpu).reshape([-1]))
            .map_err(|e| MemoryError::Invalid(format!("exact index: {e}")))?;
        Ok(scores
            .chunks(k)
            .zip(idx.chunks(k))
            .map(|(s, i)| {
                s.iter()
                    .zip(i)
                    .map(|(&score, &j)| Hit {
                        id: self.ids[j as usize],
                        score,
                    })
                    .collect()
            })
            .collect())
    }

    fn describe(&self) -> String {
        format!(
            "exact inner product on {}, {} × {}",
            crate::model::open::device_name(self.device),
            self.len(),
            self.dim
        )
    }
}

#[cfg(feature = "faiss")]
pub use self::faiss_index::FaissIndex;

#[cfg(feature = "faiss")]
mod faiss_index {
    use std::path::Path;

    use faiss::index::autotune::ParameterSpace;
    use faiss::index::IndexImpl;
    use faiss::{index_factory, read_index, write_index, Index, MetricType};
    use tch::{Device, Kind, Tensor};

    use super::{check_shape, ExactIndex, Hit, VectorIndex};
    use crate::memory::MemoryError;

    fn faiss_err(what: &str) -> impl FnOnce(faiss::error::Error) -> MemoryError + '_ {
        move |e| MemoryError::Invalid(format!("faiss: {what}: {e}"))
    }

    /// A FAISS index built from a factory string (`"IVF1024,Flat"`,
    /// `"HNSW32,Flat"`, ...), inner-product metric. Indexes that need
    /// training (IVF) collect vectors in an exact side index until
    /// `train_size` have arrived, then train on them and move them in;
    /// until then searches are exact.
    pub struct FaissIndex {
        description: String,
        dim: usize,
        index: IndexImpl,
        nprobe: Option<usize>,
        train_size: usize,
        pending: ExactIndex,
    }

    impl FaissIndex {
        /// `nprobe`: IVF lists visited per query (ignored by other kinds).
        pub fn new(
            dim: usize,
            description: &str,
            nprobe: Option<usize>,
            train_size: usize,
        ) -> Result<Self, MemoryError> {
            // IVF stores ids natively; others need the id map.
            let full = if description.starts_with("IVF") || description.starts_with("IDMap") {
                description.to_owned()
            } else {
                format!("IDMap,{description}")
            };
            let index = index_factory(dim as u32, &full, MetricType::InnerProduct)
                .map_err(faiss_err("index_factory"))?;
            let mut me = FaissIndex {
                description: full,
                dim,
                index,
                nprobe,
                train_size: train_size.max(1),
                pending: ExactIndex::new(dim, Device::Cpu),
            };
            me.apply_nprobe()?;
            Ok(me)
        }

        fn apply_nprobe(&mut self) -> Result<(), MemoryError> {
            if let (Some(n), true) = (self.nprobe, self.description.contains("IVF")) {
                let ps = ParameterSpace::new().map_err(faiss_err("parameter space"))?;
                ps.set_index_parameter(&self.index, "nprobe", n as f64)
                    .map_err(faiss_err("set nprobe"))?;
            }
            Ok(())
        }

        fn flat(t: &Tensor) -> Result<Vec<f32>, MemoryError> {
            Vec::try_from(
                t.to_kind(Kind::Float)
                    .to_device(Device::Cpu)
                    .contiguous()
                    .reshape([-1]),
            )
            .map_err(|e| MemoryError::Invalid(format!("faiss: {e}")))
        }

        /// Train when enough vectors have arrived, then move them in.
        fn maybe_train(&mut self) -> Result<(), MemoryError> {
            if self.index.is_trained() || self.pending.len() < self.train_size {
                return Ok(());
            }
            let data = Self::flat(&self.pending.vectors())?;
            self.index.train(&data).map_err(faiss_err("train"))?;
            let ids: Vec<faiss::Idx> = self
                .pending
                .ids()
                .iter()
                .map(|&i| faiss::Idx::new(i as u64))
                .collect();
            self.index
                .add_with_ids(&data, &ids)
                .map_err(faiss_err("add"))?;
            self.pending = ExactIndex::new(self.dim, Device::Cpu);
            Ok(())
        }

        /// Write the index atomically (temp file, fsync, rename). Vectors
        /// still waiting for training are not in it: rebuild from the store.
        pub fn save(&self, path: &Path) -> Result<(), MemoryError> {
            let tmp = path.with_extension("faiss.tmp");
            let tmp_s = tmp.to_string_lossy().into_owned();
            write_index(&self.index, tmp_s.as_str()).map_err(faiss_err("write_index"))?;
            let f = std::fs::File::open(&tmp).map_err(|e| MemoryError::io(&tmp, e))?;
            f.sync_all().map_err(|e| MemoryError::io(&tmp, e))?;
            std::fs::rename(&tmp, path).map_err(|e| MemoryError::io(path, e))?;
            Ok(())
        }

        /// Read an index written by [`FaissIndex::save`].
        pub fn load(path: &Path, nprobe: Option<usize>) -> Result<Self, MemoryError> {
            let s = path.to_string_lossy().into_owned();
            let index = read_index(s.as_str()).map_err(|e| MemoryError::BadFile {
                path: path.to_path_buf(),
                reason: format!("not a FAISS index: {e}"),
            })?;
            let dim = index.d() as usize;
            let mut me = FaissIndex {
                description: format!("loaded from {}", path.display()),
                dim,
                index,
                nprobe,
                train_size: usize::MAX,
                pending: ExactIndex::new(dim, Device::Cpu),
            };
            me.description = "IVF (loaded)".into();
            me.apply_nprobe()?;
            Ok(me)
        }
    }

    impl VectorIndex for FaissIndex {
        fn dim(&self) -> usize {
            self.dim
        }

        fn len(&self) -> usize {
            self.index.ntotal() as usize + self.pending.len()
        }

        fn add(&mut self, ids: &[i64], vectors: &Tensor) -> Result<(), MemoryError> {
            let n = check_shape("faiss add", vectors, self.dim)?;
            if n as usize != ids.len() {
                return Err(MemoryError::Invalid(format!(
                    "faiss add: {} ids for {n} vectors",
                    ids.len()
                )));
            }
            if self.index.is_trained() {
                let data = Self::flat(vectors)?;
                let ids: Vec<faiss::Idx> = ids.iter().map(|&i| faiss::Idx::new(i as u64)).collect();
                return self
                    .index
                    .add_with_ids(&data, &ids)
                    .map_err(faiss_err("add"));
            }
            self.pending.add(ids, vectors)?;
            self.maybe_train()
        }

        fn search(&mut self, queries: &Tensor, k: usize) -> Result<Vec<Vec<Hit>>, MemoryError> {
            let m = check_shape("faiss search", queries, self.dim)? as usize;
            let mut out = self.pending.search(queries, k)?;
            if self.index.ntotal() > 0 && k > 0 {
                let q = Self::flat(queries)?;
                let r = self.index.search(&q, k).map_err(faiss_err("search"))?;
                for (row, hits) in out.iter_mut().enumerate().take(m) {
                    for j in 0..k {
                        if let Some(id) = r.labels[row * k + j].get() {
                            hits.push(Hit {
                                id: id as i64,
                                score: r.distances[row * k + j],
                            });
                        }
                    }
                    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
                    hits.truncate(k);
                }
            }
            Ok(out)
        }

        fn describe(&self) -> String {
            format!(
                "faiss {} (nprobe {}), {} × {}{}",
                self.description,
                self.nprobe.map_or("default".to_owned(), |n| n.to_string()),
                self.len(),
                self.dim,
                if self.index.is_trained() {
                    ""
                } else {
                    ", untrained (exact until trained)"
                }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit_rows(n: i64, d: i64, seed: i64) -> Tensor {
        tch::manual_seed(seed);
        let x = Tensor::randn([n, d], (Kind::Float, Device::Cpu));
        crate::memory::embed::l2_normalize(&x)
    }

    /// Top-k by a plain loop over dot products, for comparison.
    fn brute(data: &[Vec<f32>], q: &[f32], k: usize) -> Vec<usize> {
        let mut s: Vec<(f32, usize)> = data
            .iter()
            .enumerate()
            .map(|(i, v)| (v.iter().zip(q).map(|(a, b)| a * b).sum(), i))
            .collect();
        s.sort_by(|a, b| b.0.total_cmp(&a.0));
        s.into_iter().take(k).map(|(_, i)| i).collect()
    }

    #[test]
    fn exact_index_matches_brute_force_across_growth() {
        let data = unit_rows(300, 16, 1);
        let rows: Vec<Vec<f32>> = (0..300)
            .map(|i| Vec::try_from(data.get(i)).unwrap())
            .collect();
        let mut idx = ExactIndex::new(16, Device::Cpu);
        // Several appends force the storage to grow.
        for start in (0..300).step_by(70) {
            let n = 70.min(300 - start);
            let ids: Vec<i64> = (start..start + n).map(|i| 1000 + i).collect();
            idx.add(&ids, &data.narrow(0, start, n)).unwrap();
        }
        assert_eq!(idx.len(), 300);
        let q = unit_rows(5, 16, 2);
        let hits = idx.search(&q, 7).unwrap();
        for (r, h) in hits.iter().enumerate() {
            let qv: Vec<f32> = Vec::try_from(q.get(r as i64)).unwrap();
            let want: Vec<i64> = brute(&rows, &qv, 7)
                .into_iter()
                .map(|i| 1000 + i as i64)
                .collect();
            let got: Vec<i64> = h.iter().map(|h| h.id).collect();
            assert_eq!(got, want);
            assert!(h.windows(2).all(|w| w[0].score >= w[1].score));
        }
    }

    #[test]
    fn exact_index_edge_cases() {
        let mut idx = ExactIndex::new(4, Device::Cpu);
        let q = unit_rows(2, 4, 3);
        assert_eq!(idx.search(&q, 5).unwrap(), vec![Vec::<Hit>::new(); 2]);
        idx.add(&[7], &unit_rows(1, 4, 4)).unwrap();
        assert_eq!(
            idx.search(&q, 5).unwrap()[0].len(),
            1,
            "k larger than the index"
        );
        assert!(
            idx.add(&[1, 2], &unit_rows(1, 4, 5)).is_err(),
            "ids/vectors mismatch"
        );
        assert!(idx.add(&[1], &unit_rows(1, 3, 5)).is_err(), "wrong dim");
        assert!(
            idx.search(&unit_rows(1, 5, 5), 1).is_err(),
            "wrong query dim"
        );
    }
}
