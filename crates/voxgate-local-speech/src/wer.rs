//! Word error rate, for the accuracy tests and the benchmark.
//!
//! Both texts are normalised first the way ASR evaluations usually do (lower case,
//! punctuation dropped, number words up to twenty written as digits) so that "Set a timer for
//! ten minutes." and "set a timer for 10 minutes" count as the same words.

const NUMBERS: [&str; 21] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];

/// The words of `text`, normalised.
#[must_use]
pub fn normalise(text: &str) -> Vec<String> {
    text.to_lowercase()
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '\'' {
                c
            } else {
                ' '
            }
        })
        .collect::<String>()
        .split_whitespace()
        .map(|w| {
            NUMBERS
                .iter()
                .position(|n| *n == w)
                .map_or_else(|| w.to_owned(), |i| i.to_string())
        })
        .collect()
}

/// Word-level edit distance between `reference` and `hypothesis` and the reference's length.
#[must_use]
pub fn word_errors(reference: &str, hypothesis: &str) -> (usize, usize) {
    let r = normalise(reference);
    let h = normalise(hypothesis);
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut row = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            let sub = prev[j] + usize::from(rw != hw);
            row[j + 1] = sub.min(prev[j + 1] + 1).min(row[j] + 1);
        }
        prev = row;
    }
    (prev[h.len()], r.len())
}

/// Errors per reference word (0.0 is perfect; can exceed 1.0 with many insertions).
#[must_use]
pub fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let (errors, words) = word_errors(reference, hypothesis);
    #[allow(clippy::cast_precision_loss)]
    {
        errors as f64 / words.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_and_distance() {
        assert_eq!(
            word_error_rate("Set a timer for ten minutes.", "set a timer for 10 minutes"),
            0.0
        );
        assert_eq!(word_errors("the cat sat", "the cat sat down"), (1, 3));
        assert_eq!(word_errors("the cat sat", "a cat"), (2, 3));
        assert_eq!(word_errors("", ""), (0, 0));
        assert_eq!(word_error_rate("hello", ""), 1.0);
        assert_eq!(
            normalise("It's   FINE, isn't it?"),
            ["it's", "fine", "isn't", "it"]
        );
    }
}
