//! Every prd.json shipped with ralph (the examples and the `ralph init` starter) is valid.

use std::path::Path;

#[test]
fn shipped_prd_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(root.join("examples")).expect("examples/") {
        let prd = entry.expect("entry").path().join("prd.json");
        if prd.exists() {
            checked.push(prd);
        }
    }
    checked.push(root.join("templates/prd.json"));
    assert!(checked.len() >= 2, "no example prd.json found: {checked:?}");
    for path in &checked {
        if let Err(e) = ralph::prd::store::load(path) {
            panic!("{} is not a valid prd.json:\n{e}", path.display());
        }
    }
}
