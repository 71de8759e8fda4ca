//! One voice conversation as a sans-IO machine: turn-taking, tools, history, sentence splitting and emotion, asking providers for work through outputs.
