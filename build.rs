//! Linking set-up for every binary of the crate.
//!
//! - torch-sys links libtorch but leaves no rpath in the binary, so a plain
//!   `cargo run` would fail to find `libtorch_cpu.so`. Record the libtorch
//!   directory it built against; `LD_LIBRARY_PATH` still wins at run time
//!   (DT_RUNPATH), which is how the GPU machine points us at its own libtorch.
//! - libtorch_cpu carries its own BLAS (MKL) and exports `sgemm_` & co. The
//!   `faiss` feature links the system BLAS (OpenBLAS) too. The dynamic linker
//!   binds every `sgemm_` to the first library in the executable's needed
//!   list that defines it, so with the system BLAS first libtorch's matmuls
//!   would silently run on OpenBLAS. Naming libtorch_cpu here puts it first
//!   (our own link arguments precede our dependencies'): libtorch keeps MKL,
//!   and FAISS's BLAS calls use the same MKL.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:rustc-link-search=native={lib}");
        println!("cargo:rustc-link-lib=dylib=torch_cpu");
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH");
}
