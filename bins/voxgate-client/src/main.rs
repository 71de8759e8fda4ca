//! `voxgate-client`: speak a voxgate door's protocol from the command line.
//!
//! ```text
//! voxgate-client realtime URL [--text T]... [--wav FILE] [--save-reply FILE] [--api-key K]
//! voxgate-client xiaozhi [URL] [--ota URL] [--text T]... [--wav FILE] [--save-reply FILE]
//! voxgate-client retell URL [--text T]...
//! voxgate-client gemini URL [--text T]... [--wav FILE] [--save-reply FILE]
//! voxgate-client webrtc URL [--wav FILE] [--save-reply FILE] [--text T]... [--gemini]
//! voxgate-client load xiaozhi URL [--sessions N] [--seconds S] [--wav FILE] [--threads T]
//! voxgate-client load webrtc URL --sessions N --wav FILE [--server-pid PID]
//! voxgate-client chaos 127.0.0.1:PORT --wav FILE [--sessions N] [--attempts M] ...
//! ```
//!
//! Every server event is printed on stdout as one JSON object per line; errors go to stderr
//! and make the exit status non-zero. See `docs/client.md`.

use clap::Parser as _;
use voxgate_client::cli::Cli;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match cli.runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("voxgate-client: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("voxgate-client: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
