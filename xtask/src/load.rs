//! Load test of the Xiaozhi door: concurrent streaming sessions, CPU and memory per session.

/// Options of `cargo xtask load`.
#[derive(clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask load` is not implemented yet")
}
