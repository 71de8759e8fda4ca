//! `voxgate-client`: speak a voxgate door's protocol from the command line.

fn main() {}
