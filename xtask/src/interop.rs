//! Runs the published third-party clients against the real server.

/// Options of `cargo xtask interop`.
#[derive(clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask interop` is not implemented yet")
}
