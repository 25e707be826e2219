//! torch-sys links libtorch but leaves no rpath in the binary, so a plain
//! `cargo run` would fail to find `libtorch_cpu.so`. Record the libtorch
//! directory it built against; `LD_LIBRARY_PATH` still wins at run time
//! (DT_RUNPATH), which is how the GPU machine points us at its own libtorch.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH");
}
