//! `fastblock-client completions SHELL` and `fastblock-client man DIR`: shell completions and
//! man pages generated from the same clap model that parses the arguments, so they cannot
//! drift from it.

use std::io;
use std::path::{Path, PathBuf};

/// The completion script of `cmd` for `shell`.
pub fn completions(mut cmd: clap::Command, shell: clap_complete::Shell) -> String {
    let name = cmd.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    String::from_utf8_lossy(&script).into_owned()
}

/// Writes a man page (section 1) for `cmd` and for each of its subcommands, named like git's:
/// `fastblock-client.1`, `fastblock-client-pool.1`, `fastblock-client-pool-create.1`. Returns
/// the files written.
pub fn man_pages(mut cmd: clap::Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    // Built, so that global flags (--mon, --json, ...) show on every subcommand's page.
    cmd.build();
    let mut written = Vec::new();
    let name = cmd.get_name().to_string();
    write_pages(&cmd, &name, dir, &mut written)?;
    Ok(written)
}

fn write_pages(
    cmd: &clap::Command,
    page: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let path = dir.join(format!("{page}.1"));
    let mut text = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(page.to_uppercase())
        .render(&mut text)?;
    std::fs::write(&path, text)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_page = format!("{page}-{}", sub.get_name());
        write_pages(sub, &sub_page, dir, written)?;
    }
    Ok(())
}
