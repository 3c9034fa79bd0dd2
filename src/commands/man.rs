//! `ralph man`: ralph's man page in roff, generated from the clap definition with clap_mangen:
//! `ralph man > ralph.1 && man -l ralph.1`, or `ralph man --out DIR` for `ralph.1` plus one
//! `ralph-<command>.1` page per command (install them under a `man1/` directory of your
//! MANPATH).

use std::io::Write as _;

use anyhow::Context as _;

use crate::cli::ManArgs;
use crate::protocol::ExitStatus;

/// Prints the main page, or writes every page into `args.out`.
///
/// # Errors
/// The output directory cannot be created or a page cannot be written (naming the file).
pub fn run(args: &ManArgs) -> anyhow::Result<ExitStatus> {
    let cmd = crate::cli::visible_command();
    let Some(dir) = &args.out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        let _ = std::io::stdout().write_all(&page);
        return Ok(ExitStatus::Success);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut pages = vec![("ralph".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        let name = format!("ralph-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, page_cmd) in pages {
        let mut page = Vec::new();
        clap_mangen::Man::new(page_cmd).render(&mut page)?;
        let path = dir.join(format!("{name}.1"));
        crate::fsutil::write_atomic(&path, &page)?;
        println!("{}", path.display());
    }
    Ok(ExitStatus::Success)
}
