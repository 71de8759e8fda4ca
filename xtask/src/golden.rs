//! `cargo xtask golden`: regenerate golden vectors with third-party implementations.

use crate::util;

/// Options for `cargo xtask golden`.
#[derive(clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: &Args) -> anyhow::Result<()> {
    let _ = util::root();
    anyhow::bail!("golden vector generation is being written (voxgate-realtime)")
}
