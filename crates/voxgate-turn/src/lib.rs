//! The sans-IO turn-taking machine: floor control, endpointing, interruption policy, barge-in, playback tracking.
