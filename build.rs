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
//! - `src/dist/shim/c10d.cpp`, the C face of libtorch's c10d (TCPStore,
//!   ProcessGroupGloo), is compiled here against the headers of the libtorch
//!   torch-sys built against, with its C++ ABI.
//! - The kernel tests that need a CPU feature are ignored, visibly, where the
//!   CPU that builds them lacks it: `falcon_cpu_avx512f` and
//!   `falcon_cpu_avx2_fma` say what the build host has (libtest has no skip
//!   at run time; an early `return` would pass silently).
fn main() {
    cpu_cfgs();
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:rustc-link-search=native={lib}");
        println!("cargo:rustc-link-lib=dylib=torch_cpu");
        build_c10d_shim(std::path::Path::new(&lib));
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH");
}

fn build_c10d_shim(lib: &std::path::Path) {
    let shim = "src/dist/shim";
    println!("cargo:rerun-if-changed={shim}");
    let torch = lib.parent().expect("libtorch's lib directory has a parent");
    let include = torch.join("include");
    // Wheels since torch 2.7 use the C++11 ABI; LIBTORCH_CXX11_ABI says
    // otherwise, as it does for torch-sys.
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++17")
        .include(shim)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .file(format!("{shim}/c10d.cpp"))
        .compile("falcon_c10d");
}

fn cpu_cfgs() {
    println!("cargo::rustc-check-cfg=cfg(falcon_cpu_avx512f)");
    println!("cargo::rustc-check-cfg=cfg(falcon_cpu_avx2_fma)");
    // Only where the tests run on the machine that builds them.
    if std::env::var("TARGET").ok() != std::env::var("HOST").ok() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            println!("cargo:rustc-cfg=falcon_cpu_avx512f");
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            println!("cargo:rustc-cfg=falcon_cpu_avx2_fma");
        }
    }
}
