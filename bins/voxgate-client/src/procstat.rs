//! Reading the server's `/proc` figures: what the load, WebRTC load and chaos tools share.

/// Clock ticks per second of `/proc/PID/stat` (`getconf CLK_TCK`, 100 on every Linux we run).
pub(crate) fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    #[test]
    fn clock_ticks_are_positive() {
        assert!(super::clock_ticks() > 0);
    }
}
