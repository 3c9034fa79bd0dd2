//! The module structure docs/architecture.md promises, checked from the source: no import cycle
//! between top-level modules of `src/`, `protocol/` a leaf, and the native loop free of the outer
//! loop's types.
//!
//! An edge `a -> b` is any `crate::b` path (in a `use` or inline) in code under `src/a` (comment
//! lines are skipped, test modules count). Run just these checks with
//! `cargo test --features test-fakes architecture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if dir.is_file() {
        out.push(dir.to_path_buf());
        return out;
    }
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out
}

/// The top-level modules: `src/<m>.rs` and `src/<m>/`, without the crate roots.
fn top_modules() -> BTreeMap<String, PathBuf> {
    let mut mods = BTreeMap::new();
    for entry in std::fs::read_dir(src()).unwrap().flatten() {
        let p = entry.path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "main" || name == "lib" {
            continue;
        }
        mods.insert(name, p);
    }
    mods
}

/// Code lines of a file: comment lines dropped, trailing `//` comments cut.
fn code_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| match l.find(" // ") {
            Some(i) => l[..i].to_string(),
            None => l.to_string(),
        })
        .collect()
}

/// `module -> modules it names as crate::<module>`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mods = top_modules();
    let re = regex::Regex::new(r"crate::([a-z_][a-z0-9_]*)").unwrap();
    let mut g = BTreeMap::new();
    for (name, path) in &mods {
        let mut deps = BTreeSet::new();
        for file in rust_files(path) {
            for line in code_lines(&file) {
                for c in re.captures_iter(&line) {
                    let dep = c[1].to_string();
                    if dep != *name && mods.contains_key(&dep) {
                        deps.insert(dep);
                    }
                }
            }
        }
        g.insert(name.clone(), deps);
    }
    g
}

/// Strongly connected components with more than one module (each is an import cycle).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability closure; small graphs, so the simple way.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            for d in g.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|k| (k, reach(k))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for a in g.keys() {
        if done.contains(a) {
            continue;
        }
        let mut comp: Vec<String> = g
            .keys()
            .filter(|b| *b == a || (reaches[a].contains(*b) && reaches[*b].contains(a)))
            .cloned()
            .collect();
        comp.sort();
        for m in &comp {
            done.insert(m.clone());
        }
        if comp.len() > 1 {
            out.push(comp);
        }
    }
    out
}

#[test]
fn architecture_no_import_cycles_between_top_level_modules() {
    let g = graph();
    let found = cycles(&g);
    let explain: Vec<String> = found
        .iter()
        .map(|comp| {
            let edges: Vec<String> = comp
                .iter()
                .flat_map(|a| {
                    g[a].iter()
                        .filter(|b| comp.contains(b))
                        .map(move |b| format!("{a} -> {b}"))
                })
                .collect();
            format!("{{{}}}: {}", comp.join(", "), edges.join(", "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "import cycles between top-level modules:\n{}",
        explain.join("\n")
    );
}

#[test]
fn architecture_protocol_is_a_leaf() {
    let g = graph();
    assert!(
        g["protocol"].is_empty(),
        "protocol/ must import nothing from the crate, but names: {:?}",
        g["protocol"]
    );
}

#[test]
fn architecture_the_native_loop_does_not_know_the_outer_loop() {
    let g = graph();
    let allowed: BTreeSet<&str> =
        ["protocol", "process", "prd", "progress", "fsutil", "redact"].into();
    let bad: Vec<&String> = g["native"]
        .iter()
        .filter(|d| !allowed.contains(d.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "native/ may use only {allowed:?}, but names {bad:?}"
    );
}

/// `(file, first line, length)` of every `fn` in `path`, measured from its `fn` line to its
/// closing brace at the same indentation.
fn functions(path: &Path) -> Vec<(String, usize, usize)> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let re = regex::Regex::new(r"^(\s*)(pub(\([a-z]+\))? )?(async )?fn ").unwrap();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(c) = re.captures(line) else { continue };
        let indent = c[1].to_string();
        if line.trim_end().ends_with(';') {
            continue;
        }
        let end = lines[i..]
            .iter()
            .position(|l| *l == format!("{indent}}}"))
            .map(|p| i + p)
            .unwrap_or(i);
        out.push((line.trim().to_string(), i + 1, end - i + 1));
    }
    out
}

#[test]
fn architecture_no_function_under_run_is_longer_than_150_lines() {
    let mut long = Vec::new();
    for file in rust_files(&src().join("run")) {
        if file.ends_with("tests.rs") {
            continue;
        }
        for (sig, line, len) in functions(&file) {
            if len > 150 {
                long.push(format!("{}:{line}: {len} lines: {sig}", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over 150 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn architecture_no_too_many_arguments_allowance() {
    let mut found = Vec::new();
    for file in rust_files(&src()) {
        let text = std::fs::read_to_string(&file).unwrap();
        if text.contains("too_many_arguments") {
            found.push(file.display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "#[allow(clippy::too_many_arguments)] in {found:?}"
    );
}

#[test]
fn architecture_only_process_spawns_or_signals() {
    let patterns = [
        "Command::new(",
        "signal::kill(",
        "killpg(",
        "libc::kill(",
        ".spawn()",
    ];
    let mut offenders = Vec::new();
    for (name, path) in top_modules() {
        if name == "process" {
            continue;
        }
        for file in rust_files(&path) {
            // A module file of unit tests (`#[cfg(test)] mod tests;` → tests.rs) is test code
            // from its first line.
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let mut in_tests = name == "tests.rs" || name.ends_with("_tests.rs");
            for (n, line) in code_lines(&file).iter().enumerate() {
                if line.contains("#[cfg(test)]") {
                    in_tests = true;
                }
                // clap's `Command` describes a command line; it runs nothing.
                let line = line.replace("clap::Command::new(", "");
                if !in_tests && patterns.iter().any(|p| line.contains(p)) {
                    offenders.push(format!(
                        "{}:{}: {}",
                        file.strip_prefix(src()).unwrap().display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "only src/process/ may spawn or signal processes:\n{}",
        offenders.join("\n")
    );
}
