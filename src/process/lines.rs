//! Turning a child's output pipe into [`OutputLine`]s with bounded memory.
//!
//! Lines are split on `\n` as bytes, so invalid UTF-8 or a multi-megabyte JSON line cannot break
//! the reader. A line's buffer never holds more than `max_line_bytes`: the rest of an oversize
//! line is counted (for [`OutputLine::truncated_from`]) and dropped, so memory stays flat however
//! much a child prints (cases 14 and 15 in the field notes).

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

use super::{OutputLine, StreamKind};

/// Bytes asked from the pipe per read; the kernel pipe buffer is 64 KiB by default.
const READ_CHUNK: usize = 64 * 1024;

/// Collects the bytes of one line, keeping at most `max` of them.
#[derive(Debug)]
pub(crate) struct LineAssembler {
    /// Most bytes kept for one line.
    max: usize,
    /// The kept prefix of the current line.
    buf: Vec<u8>,
    /// Length of the current line so far, kept or not (bytes).
    total: usize,
    /// Last byte seen on the current line, to trim a `\r` that was not kept.
    last: Option<u8>,
}

impl LineAssembler {
    /// An empty assembler keeping at most `max` bytes per line.
    pub(crate) fn new(max: usize) -> Self {
        LineAssembler {
            max,
            buf: Vec::new(),
            total: 0,
            last: None,
        }
    }

    /// Appends bytes that contain no `\n` to the current line.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let Some(&last) = bytes.last() else {
            return;
        };
        self.total = self.total.saturating_add(bytes.len());
        self.last = Some(last);
        let keep = bytes.len().min(self.max.saturating_sub(self.buf.len()));
        if keep == 0 {
            return;
        }
        let needed = self.buf.len() + keep;
        if needed > self.buf.capacity() {
            // Grow geometrically but never past `max`: `Vec`'s own growth could double a
            // 9 MB buffer to 18 MB when the cap is 16 MB.
            let target = needed.max(self.buf.capacity() * 2).min(self.max);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(&bytes[..keep]);
    }

    /// Ends the current line (a `\n` was seen) and returns it; the assembler is empty again.
    pub(crate) fn take(&mut self, stream: StreamKind) -> OutputLine {
        let mut total = self.total;
        let mut buf = std::mem::take(&mut self.buf);
        if self.last == Some(b'\r') {
            total -= 1;
            buf.truncate(total);
        }
        self.total = 0;
        self.last = None;
        let truncated = total > buf.len();
        if truncated {
            trim_partial_char(&mut buf);
        }
        let text = match String::from_utf8(buf) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        };
        OutputLine {
            stream,
            text,
            truncated_from: truncated.then_some(total),
        }
    }

    /// Returns the final partial line (bytes after the last `\n`), if there is one.
    pub(crate) fn finish(&mut self, stream: StreamKind) -> Option<OutputLine> {
        (self.total > 0).then(|| self.take(stream))
    }

    /// Capacity of the line buffer (bytes), to check that memory stays bounded.
    #[cfg(test)]
    pub(crate) fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// Drops a UTF-8 sequence cut in half by truncation, so the text does not end in U+FFFD.
fn trim_partial_char(buf: &mut Vec<u8>) {
    // A UTF-8 character is at most 4 bytes: look back at most 3 continuation bytes for its lead.
    let len = buf.len();
    for back in 1..=len.min(4) {
        let byte = buf[len - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte
        }
        let width = match byte {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return, // not a lead byte: invalid anyway, leave it to the lossy decoder
        };
        if width > back {
            buf.truncate(len - back);
        }
        return;
    }
}

/// Reads `pipe` to EOF, sending each line to `tx` in order; stops early if `tx` is closed.
///
/// A read error ends the stream like EOF: the caller learns how the child ended from its exit
/// status, and the lines read so far are still delivered.
pub(crate) async fn pump<R>(
    pipe: R,
    stream: StreamKind,
    max_line_bytes: usize,
    tx: mpsc::Sender<OutputLine>,
) where
    R: AsyncRead + Unpin,
{
    let mut reader = BufReader::with_capacity(READ_CHUNK, pipe);
    let mut line = LineAssembler::new(max_line_bytes);
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) => break, // EOF
            Ok(chunk) => chunk,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                tracing::debug!(?stream, %err, "reading the child's output failed; treating it as EOF");
                break;
            }
        };
        let len = chunk.len();
        let mut rest = chunk;
        while let Some(pos) = memchr::memchr(b'\n', rest) {
            line.push(&rest[..pos]);
            if tx.send(line.take(stream)).await.is_err() {
                return;
            }
            rest = &rest[pos + 1..];
        }
        line.push(rest);
        reader.consume(len);
    }
    if let Some(last) = line.finish(stream) {
        // The receiver may be gone already; nothing else to do with the line then.
        let _ = tx.send(last).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(input: &[u8], max: usize) -> Vec<OutputLine> {
        let mut asm = LineAssembler::new(max);
        let mut out = Vec::new();
        let mut rest = input;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            asm.push(&rest[..pos]);
            out.push(asm.take(StreamKind::Stdout));
            rest = &rest[pos + 1..];
        }
        asm.push(rest);
        out.extend(asm.finish(StreamKind::Stdout));
        out
    }

    #[test]
    fn crlf_invalid_utf8_and_final_partial_line() {
        let lines = lines_of(b"one\r\n\xff\xfebad\n\npartial", 100);
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["one", "\u{fffd}\u{fffd}bad", "", "partial"]);
        assert!(lines.iter().all(|l| l.truncated_from.is_none()));
    }

    #[test]
    fn oversize_line_is_cut_and_reports_full_length() {
        let lines = lines_of(b"abcdefghij\nok\n", 4);
        assert_eq!(lines[0].text, "abcd");
        assert_eq!(lines[0].truncated_from, Some(10));
        assert_eq!(lines[1].text, "ok");
        assert_eq!(lines[1].truncated_from, None);
    }

    #[test]
    fn carriage_return_past_the_cut_does_not_count_as_content() {
        // "abcd\r" is 5 bytes; without the `\r` the line fits in 4, so it is not truncated.
        let lines = lines_of(b"abcd\r\n", 4);
        assert_eq!(lines[0].text, "abcd");
        assert_eq!(lines[0].truncated_from, None);
    }

    #[test]
    fn cut_inside_a_multibyte_char_drops_the_half_char() {
        // "é" is 2 bytes (c3 a9); a cut after 2 bytes of "aé" leaves only its lead byte.
        let lines = lines_of("aéz\n".as_bytes(), 2);
        assert_eq!(lines[0].text, "a");
        assert_eq!(lines[0].truncated_from, Some(4));
    }

    #[test]
    fn memory_stays_bounded_for_a_huge_line() {
        let max = 1 << 20;
        let mut asm = LineAssembler::new(max);
        let chunk = vec![b'x'; 300 * 1024];
        for _ in 0..400 {
            // 120 MB in total, never a newline.
            asm.push(&chunk);
            assert!(
                asm.buffered_capacity() <= max,
                "{}",
                asm.buffered_capacity()
            );
        }
        let line = asm.finish(StreamKind::Stderr).expect("partial line");
        assert_eq!(line.text.len(), max);
        assert_eq!(line.truncated_from, Some(400 * 300 * 1024));
        assert_eq!(line.stream, StreamKind::Stderr);
    }

    #[tokio::test]
    async fn pump_delivers_lines_in_order_including_the_last_partial_one() {
        let (tx, mut rx) = mpsc::channel(2);
        let input: &[u8] = b"first\nsecond\r\nthird";
        let reader = tokio::spawn(pump(input, StreamKind::Stdout, 64, tx));
        let mut got = Vec::new();
        while let Some(line) = rx.recv().await {
            got.push(line.text);
        }
        reader.await.expect("pump task");
        assert_eq!(got, ["first", "second", "third"]);
    }
}
