//! Build script: names the git commit ralph is built from, for `ralph --version`
//! (`ralph 0.1.0 (a1b2c3d4e5f6 2026-12-01)`). Outside a git checkout (a source tarball, a
//! crates.io build) the version says `(no git commit)`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let date = git(&["log", "-1", "--format=%cs", "HEAD"]);
    let described = match (commit, date) {
        (Some(c), Some(d)) => format!("{c} {d}"),
        (Some(c), None) => c,
        _ => "no git commit".to_owned(),
    };
    println!("cargo:rustc-env=RALPH_BUILD_COMMIT={described}");
    // Rebuild when HEAD moves: HEAD itself (a checkout) and the branch refs (a commit).
    for dir in [
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ]
    .into_iter()
    .flatten()
    {
        for file in ["HEAD", "refs/heads", "packed-refs"] {
            let path = Path::new(&dir).join(file);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
