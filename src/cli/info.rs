//! `falcon info`: versions, threads, CUDA status, where the custom kernels'
//! compiler comes from, and the embedded model.

use anyhow::Result;

use falcon_rl::model::device::cuda_status;
use falcon_rl::model::hub;

pub fn run() -> Result<()> {
    let cuda = cuda_status();
    println!("falcon-rl {}", env!("CARGO_PKG_VERSION"));
    println!("libtorch threads: {}", tch::get_num_threads());
    println!("cuda library loaded: {}", cuda.library_loaded);
    println!("cuda devices: {}", cuda.device_count);
    if let Some(r) = &cuda.reason {
        println!("cuda unavailable: {r}");
    }
    match falcon_rl::kernels::toolchain::load_nvrtc() {
        Ok(at) => println!("custom kernels: NVRTC {at}"),
        Err(e) => println!("custom kernels: libtorch reference paths only ({e})"),
    }
    match hub::embedded_gguf() {
        Ok(p) => println!("embedded model: {}", p.display()),
        Err(e) => println!("embedded model: {e}"),
    }
    Ok(())
}
