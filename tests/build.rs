//! Generates the gRPC test's service from the example's proto (one file for both):
//! `../examples/proto/greeter.proto`, compiled by protox (no system `protoc`) and
//! tonic-prost-build into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../examples/proto/greeter.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["../examples/proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
