//! Writes the DataStage CRD to `crds/generated/` (run from the repository
//! root): `cargo run -p ferry-crds --bin crdgen`. A test fails when the
//! committed file differs from the types.

fn main() -> std::io::Result<()> {
    let path = std::path::Path::new(ferry_crds::CRD_PATH);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, ferry_crds::crd_yaml())?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
