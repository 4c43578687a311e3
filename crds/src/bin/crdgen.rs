//! Writes every CRD (DataStage, StoreBudget, StagingQuota, NodeCache) to `crds/generated/` and to the Helm chart's
//! `crds/`, and the API reference made from them to `docs/api-reference.md` (run from the repository root):
//! `cargo run -p ferry-crds --bin crdgen`. A test fails when a committed copy differs from the types.

fn main() -> std::io::Result<()> {
    for (relative, yaml) in ferry_crds::committed_files() {
        let path = std::path::Path::new(relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, yaml)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
