//! Incremental decoder for `text/event-stream` bodies (the part of the format that
//! OpenAI-compatible servers use: `data:` fields, comments, blank-line dispatch).

use crate::error::ProviderError;

/// Longest line accepted; a server that never sends a newline must not exhaust memory.
const MAX_LINE: usize = 4 << 20;
/// Most data one event may gather; a server that never sends the blank line ending an event
/// must not exhaust memory either.
const MAX_EVENT: usize = 4 << 20;

/// Turns body chunks (split anywhere, even inside a UTF-8 sequence) into event data strings.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next body chunk and appends the data of every completed event to `out`.
    ///
    /// # Errors
    /// [`ProviderError::Protocol`] for a line that is not UTF-8 or longer than 4 MiB, or an
    /// event whose data grows past 4 MiB.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<String>) -> Result<(), ProviderError> {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..pos]);
            rest = &rest[pos + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line_done(&line, out)?;
            // Keep the allocation for the next line.
            self.line = line;
            self.line.clear();
        }
        if self.line.len() + rest.len() > MAX_LINE {
            return Err(ProviderError::Protocol("SSE line longer than 4 MiB".into()));
        }
        self.line.extend_from_slice(rest);
        Ok(())
    }

    /// Ends the stream: an event whose terminating blank line never came is still delivered,
    /// because some servers close right after the last `data:` line.
    ///
    /// # Errors
    /// As [`SseDecoder::feed`].
    pub fn finish(&mut self, out: &mut Vec<String>) -> Result<(), ProviderError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<String>) -> Result<(), ProviderError> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let line = std::str::from_utf8(line)
            .map_err(|_| ProviderError::Protocol("SSE line is not UTF-8".into()))?;
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        // `event:`, `id:`, `retry:` and comments (empty field name) carry nothing we use.
        if field == "data" {
            if self.data.len() + value.len() >= MAX_EVENT {
                return Err(ProviderError::Protocol(
                    "SSE event data longer than 4 MiB".into(),
                ));
            }
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<String>) {
        if self.has_data {
            out.push(std::mem::take(&mut self.data));
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(body: &[u8], piece: usize) -> Vec<String> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for c in body.chunks(piece) {
            d.feed(c, &mut out).unwrap();
        }
        d.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn splits_events_at_any_chunk_boundary() {
        let body = ": keep-alive\r\n\r\ndata: {\"a\":\"é\"}\r\n\r\nevent: x\ndata:b\ndata: c\n\ndata: [DONE]\n\n";
        for piece in 1..body.len() {
            assert_eq!(
                decode_in_pieces(body.as_bytes(), piece),
                vec!["{\"a\":\"é\"}", "b\nc", "[DONE]"],
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn last_event_without_blank_line_is_delivered() {
        assert_eq!(decode_in_pieces(b"data: x", 3), vec!["x"]);
    }

    #[test]
    fn event_data_is_bounded_across_lines() {
        // Regression: each line was bounded but the data of one event, gathered over many
        // `data:` lines without the blank line that ends it, was not.
        let mut line = b"data: ".to_vec();
        line.resize(1 << 20, b'x');
        line.push(b'\n');
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        let results: Vec<bool> = (0..6).map(|_| d.feed(&line, &mut out).is_ok()).collect();
        assert_eq!(results, [true, true, true, true, false, false]);
        assert!(out.is_empty());
    }

    #[test]
    fn invalid_utf8_is_a_protocol_error() {
        let mut d = SseDecoder::new();
        let err = d.feed(b"data: \xff\xfe\n", &mut Vec::new()).unwrap_err();
        assert!(matches!(err, ProviderError::Protocol(_)));
    }
}
