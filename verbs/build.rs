//! Link the cdylib as `libibverbs.so.1` with libibverbs' version script.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    let map = std::path::Path::new(&dir).join("libibverbs.map");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
