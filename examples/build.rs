//! Generates the gRPC example's service from `proto/greeter.proto`: protox compiles it (no
//! system `protoc` needed) and tonic-prost-build writes the Rust into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/greeter.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
