//! Streaming record I/O: JSONL (constant memory), JSON arrays and Parquet in; JSONL, JSON and
//! Parquet out; solutions in any [`Format`], auto-detected from the first record.

use crate::error::{Error, RecordError, Result};
use crate::formats::Format;
use crate::output::Output;
use crate::parquet_io::{is_parquet, read_parquet, write_parquet};
use crate::record::Solution;
use serde_json::Value;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// One raw record and its 1-based position (line number for JSONL, index for arrays/Parquet).
pub type RawRecord = (usize, std::result::Result<Value, RecordError>);

/// Iterate over the JSON records of a file: JSONL line by line, a JSON array, or Parquet rows.
/// `-` reads standard input.
pub fn raw_records(path: &Path) -> Result<Box<dyn Iterator<Item = RawRecord>>> {
    let io_err = |source| Error::Io {
        file: path.to_path_buf(),
        source,
    };
    if is_parquet(path) {
        let batches = read_parquet(path).map_err(|message| Error::Other {
            file: path.to_path_buf(),
            message,
        })?;
        let mut n = 0usize;
        return Ok(Box::new(batches.flat_map(move |b| {
            let rows: Vec<RawRecord> = match b {
                Ok(rows) => rows
                    .into_iter()
                    .map(|v| {
                        n += 1;
                        (n, Ok(v))
                    })
                    .collect(),
                Err(e) => vec![(n + 1, Err(RecordError::Parquet(e)))],
            };
            rows
        })));
    }
    let reader: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(BufReader::new(io::stdin()))
    } else {
        Box::new(BufReader::with_capacity(1 << 16, File::open(path).map_err(io_err)?))
    };
    let mut reader = reader;
    // A UTF-8 byte-order mark (Windows editors, Excel's "UTF-8" CSV-to-JSON exports) is skipped,
    // as Python's `utf-8-sig` does.
    if reader.fill_buf().map_err(io_err)?.starts_with(b"\xEF\xBB\xBF") {
        reader.consume(3);
    }
    // Peek at the first non-blank byte: `[` means one JSON array.
    let first = loop {
        let buf = reader.fill_buf().map_err(io_err)?;
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => break Some(buf[i]),
            None if buf.is_empty() => break None,
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    };
    let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if first == Some(b'{') && is_json {
        // A `.json` file holding one (possibly pretty-printed) object, or several in a row.
        let values: Vec<RawRecord> = serde_json::Deserializer::from_reader(reader)
            .into_iter::<Value>()
            .enumerate()
            .map(|(i, v)| (i + 1, v.map_err(|e| RecordError::Json(e.to_string()))))
            .collect();
        return Ok(Box::new(values.into_iter()));
    }
    if first == Some(b'[') {
        // One JSON array is read whole: bounded, so an endless stream ends with a message.
        let mut s = String::new();
        reader
            .take(MAX_ARRAY_BYTES as u64 + 1)
            .read_to_string(&mut s)
            .map_err(io_err)?;
        if s.len() > MAX_ARRAY_BYTES {
            return Err(Error::Other {
                file: path.to_path_buf(),
                message: format!(
                    "a JSON array longer than {} GiB, read whole: write it as JSON Lines (one record a line), which is streamed",
                    MAX_ARRAY_BYTES >> 30
                ),
            });
        }
        let arr: Vec<Value> = serde_json::from_str(&s).map_err(|e| Error::Other {
            file: path.to_path_buf(),
            message: format!("invalid JSON array: {e}"),
        })?;
        return Ok(Box::new(arr.into_iter().enumerate().map(|(i, v)| (i + 1, Ok(v)))));
    }
    Ok(Box::new(JsonLines::new(reader, MAX_LINE_BYTES)))
}

/// The longest JSON Lines record read (64 MiB, some hundred times the longest agent trajectory or
/// reasoning chain): a longer line is not a record but a binary file, a device (`/dev/zero`) or
/// JSON without line breaks, and reading it whole would take memory without bound.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The largest JSON array read (1 GiB): an array is parsed whole, a JSON Lines file is streamed.
pub const MAX_ARRAY_BYTES: usize = 1 << 30;

struct JsonLines {
    reader: Box<dyn BufRead>,
    line: usize,
    buf: String,
    max_line: usize,
    /// An over-long line ended the read.
    ended: bool,
}

impl JsonLines {
    fn new(reader: Box<dyn BufRead>, max_line: usize) -> JsonLines {
        JsonLines {
            reader,
            line: 0,
            buf: String::new(),
            max_line,
            ended: false,
        }
    }
}

impl Iterator for JsonLines {
    type Item = RawRecord;
    fn next(&mut self) -> Option<RawRecord> {
        if self.ended {
            return None;
        }
        loop {
            self.buf.clear();
            self.line += 1;
            let limit = self.max_line as u64 + 1;
            match (&mut self.reader).take(limit).read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(n) if n > self.max_line && !self.buf.ends_with('\n') => {
                    // What follows is no record either: reading stops here, the memory given back.
                    self.ended = true;
                    self.buf = String::new();
                    return Some((self.line, Err(RecordError::TooLong(self.max_line >> 20))));
                }
                Ok(_) if self.buf.trim().is_empty() => continue,
                Ok(_) => {
                    return Some((
                        self.line,
                        serde_json::from_str(&self.buf).map_err(|e| RecordError::Json(e.to_string())),
                    ))
                }
                Err(e) => return Some((self.line, Err(RecordError::Json(e.to_string())))),
            }
        }
    }
}

/// Reads solutions from a file in any format.
pub struct SolutionReader {
    path: PathBuf,
    records: std::iter::Peekable<Box<dyn Iterator<Item = RawRecord>>>,
    format: Option<Format>,
    skip_invalid: bool,
    skipped: usize,
    index: usize,
    pending: VecDeque<Solution>,
}

impl SolutionReader {
    /// Open `path`; `format` of `None` detects it from the first record.
    pub fn open(path: impl AsRef<Path>, format: Option<Format>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let records = raw_records(&path)?.peekable();
        Ok(SolutionReader {
            path,
            records,
            format,
            skip_invalid: false,
            skipped: 0,
            index: 0,
            pending: VecDeque::new(),
        })
    }

    /// Skip records that fail to parse instead of stopping at the first one.
    pub fn skip_invalid(mut self, yes: bool) -> Self {
        self.skip_invalid = yes;
        self
    }

    /// How many records were skipped as invalid so far.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// The format, detecting it from the first record if needed.
    pub fn format(&mut self) -> Result<Option<Format>> {
        if self.format.is_none() {
            if let Some((line, Ok(v))) = self.records.peek() {
                let f = Format::detect(v).ok_or_else(|| Error::Record {
                    file: self.path.clone(),
                    line: *line,
                    source: RecordError::Format(unknown_format(v)),
                })?;
                self.format = Some(f);
            }
        }
        Ok(self.format)
    }
}

/// Why a record's format cannot be told, and what to do.
fn unknown_format(v: &Value) -> String {
    let fields: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let has = |k: &str| fields.contains(&k);
    if (has("question") || has("problem")) && !has("steps") {
        return format!(
            "a problem, not a solution (fields: {}): files of problems are read by `generate`, `search` \
and `rl` (in Python: stepwise.read_problems(path), or the path itself)",
            fields.join(", ")
        );
    }
    format!(
        "cannot tell the format of this record (fields: {}); name it: `--from FORMAT` on the command \
line, `format=` in Python",
        if fields.is_empty() {
            "none: not an object".to_string()
        } else {
            fields.join(", ")
        }
    )
}

impl Iterator for SolutionReader {
    type Item = Result<Solution>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(s) = self.pending.pop_front() {
                return Some(Ok(s));
            }
            let format = match self.format() {
                Ok(Some(f)) => f,
                Ok(None) => {
                    return self.records.next().map(|(line, r)| {
                        Err(Error::Record {
                            file: self.path.clone(),
                            line,
                            source: r.err().unwrap_or(RecordError::Json("unreadable record".into())),
                        })
                    })
                }
                Err(e) => return Some(Err(e)),
            };
            let (line, rec) = self.records.next()?;
            let index = self.index;
            self.index += 1;
            let checked = |sols: Vec<Solution>| -> Result<Vec<Solution>, RecordError> {
                for s in &sols {
                    s.check_values()?;
                }
                Ok(sols)
            };
            match rec.and_then(|v| format.read(&v, index).map_err(RecordError::from).and_then(checked)) {
                Ok(sols) => self.pending.extend(sols),
                Err(source) if self.skip_invalid => {
                    self.skipped += 1;
                    let _ = source;
                }
                Err(source) => {
                    return Some(Err(Error::Record {
                        file: self.path.clone(),
                        line,
                        source,
                    }))
                }
            }
        }
    }
}

/// Read every solution of a file (convenience for small files and tests).
pub fn read_solutions(path: impl AsRef<Path>, format: Option<Format>) -> Result<Vec<Solution>> {
    SolutionReader::open(path, format)?.collect()
}

enum Sink {
    Lines(Box<dyn Write>),
    Array(Box<dyn Write>, bool),
    Parquet(PathBuf, Vec<Value>),
}

/// Writes solutions in a format to JSONL (default), a JSON array (`.json`) or Parquet. A regular
/// file is written under a temporary name beside it and renamed into place by
/// [`SolutionWriter::finish`] (a run that fails leaves an existing file as it was, and a partial
/// output never looks complete); a link updates the file it points to; a device or FIFO is
/// written through ([`crate::output`]).
pub struct SolutionWriter {
    path: PathBuf,
    format: Format,
    sink: Sink,
    group: Vec<Solution>,
    /// Where it is written.
    output: Option<Output>,
}

/// A small file read whole (a checkpoint's `config.json` or `tokenizer.json`, a list of servers,
/// a problems file to fingerprint), after checking that it is a file: a device or pipe in its
/// place (`/dev/zero`) would be read without end. Links are followed (the Hugging Face cache
/// links snapshots to blobs).
pub fn read_regular_file(path: &Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!("{}: not a regular file (a folder, device or pipe)", path.display());
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Refuse to write `output` when it is `input` (the same file, by whatever path): reading and
/// overwriting one file loses what was not read yet.
pub fn refuse_same_file(input: &Path, output: &Path) -> Result<()> {
    if input == Path::new("-") || output == Path::new("-") {
        return Ok(());
    }
    let canonical = |p: &Path| -> Option<PathBuf> {
        if let Ok(c) = p.canonicalize() {
            return Some(c);
        }
        let parent = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Some(parent.canonicalize().ok()?.join(p.file_name()?))
    };
    match (canonical(input), canonical(output)) {
        (Some(a), Some(b)) if a == b => Err(Error::Other {
            file: output.to_path_buf(),
            message: format!(
                "the output is the input file ({}): write to another file",
                input.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// Refuses an output name that promises a format stepwise does not write: JSONL unless the name
/// says JSON or Parquet, and a name that promises another format is refused rather than filled
/// with JSONL (checked before a long run starts, not after).
pub fn check_output_name(path: &Path) -> Result<(), Error> {
    match path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("jsonl" | "json" | "parquet" | "ndjson") => Ok(()),
        Some(other) => Err(Error::Other {
            file: path.to_path_buf(),
            message: format!("stepwise does not write `.{other}` files: name the output .jsonl, .json or .parquet"),
        }),
    }
}

impl SolutionWriter {
    /// Create `path` (`-` for standard output).
    pub fn create(path: impl AsRef<Path>, format: Format) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        check_output_name(&path)?;
        let output = Output::prepare(&path)?;
        let sink = if is_parquet(&path) {
            Sink::Parquet(output.writing().to_path_buf(), Vec::new())
        } else if path.extension().is_some_and(|e| e == "json") {
            Sink::Array(Box::new(BufWriter::with_capacity(1 << 16, output.open()?)), true)
        } else {
            Sink::Lines(Box::new(BufWriter::with_capacity(1 << 16, output.open()?)))
        };
        Ok(SolutionWriter {
            path,
            format,
            sink,
            group: Vec::new(),
            output: Some(output),
        })
    }

    fn emit(&mut self, sols: &[Solution]) -> Result<()> {
        let records = self.format.write(sols).map_err(|e| Error::Other {
            file: self.path.clone(),
            message: e.to_string(),
        })?;
        let io_err = |source| Error::Io {
            file: self.path.clone(),
            source,
        };
        for v in records {
            match &mut self.sink {
                Sink::Lines(w) => {
                    serde_json::to_writer(&mut *w, &v).map_err(|e| io_err(e.into()))?;
                    w.write_all(b"\n").map_err(io_err)?;
                }
                Sink::Array(w, first) => {
                    w.write_all(if *first { b"[\n" } else { b",\n" }).map_err(io_err)?;
                    *first = false;
                    serde_json::to_writer(&mut *w, &v).map_err(|e| io_err(e.into()))?;
                }
                Sink::Parquet(_, rows) => rows.push(v),
            }
        }
        Ok(())
    }

    /// Write one solution (grouped formats buffer the solutions of one problem).
    pub fn write(&mut self, s: &Solution) -> Result<()> {
        if !self.format.groups_by_problem() {
            return self.emit(std::slice::from_ref(s));
        }
        if self.group.first().is_some_and(|g| !same_group(g, s)) {
            let g = std::mem::take(&mut self.group);
            self.emit(&g)?;
        }
        self.group.push(s.clone());
        Ok(())
    }

    /// Flush everything and close the file.
    pub fn finish(mut self) -> Result<()> {
        if !self.group.is_empty() {
            let g = std::mem::take(&mut self.group);
            self.emit(&g)?;
        }
        let io_err = |source| Error::Io {
            file: self.path.clone(),
            source,
        };
        let sink = std::mem::replace(&mut self.sink, Sink::Parquet(PathBuf::new(), Vec::new()));
        let sink_closed = match sink {
            Sink::Lines(mut w) => {
                w.flush().map_err(io_err)?;
                Some(w)
            }
            Sink::Array(mut w, first) => {
                w.write_all(if first { b"[]\n" } else { b"\n]\n" }).map_err(io_err)?;
                w.flush().map_err(io_err)?;
                Some(w)
            }
            Sink::Parquet(at, rows) => {
                write_parquet(&at, &rows).map_err(|message| Error::Other {
                    file: self.path.clone(),
                    message,
                })?;
                None
            }
        };
        // The sink is closed before the file is renamed into place.
        drop(sink_closed);
        match self.output.take() {
            Some(output) => output.commit(),
            None => Ok(()),
        }
    }
}

fn same_group(a: &Solution, b: &Solution) -> bool {
    match (a.meta.get("_omegaprm_group"), b.meta.get("_omegaprm_group")) {
        (Some(x), Some(y)) => x == y,
        _ => a.problem_id == b.problem_id,
    }
}

/// Every solution of a file, each with an id no other has: a file whose records are matched,
/// grouped or resumed by id (annotation, scoring, best-of-N, evaluation) would otherwise lose
/// or double-count the repeats silently. The error names both records.
pub fn read_solution_set(path: impl AsRef<Path>, from: Option<Format>) -> Result<Vec<Solution>> {
    let path = path.as_ref();
    let sols: Vec<Solution> = SolutionReader::open(path, from)?.collect::<Result<_>>()?;
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, s) in sols.iter().enumerate() {
        if let Some(first) = seen.insert(s.id.as_str(), i) {
            return Err(Error::Other {
                file: path.to_path_buf(),
                message: format!(
                    "record {}: field `id`: `{}` is the id of record {} too (ids must be unique)",
                    i + 1,
                    s.id,
                    first + 1
                ),
            });
        }
    }
    Ok(sols)
}

/// Write solutions to a file in one go.
pub fn write_solutions(path: impl AsRef<Path>, format: Format, sols: &[Solution]) -> Result<()> {
    let mut w = SolutionWriter::create(path, format)?;
    for s in sols {
        w.write(s)?;
    }
    w.finish()
}

/// Write any serializable records as JSONL, under a temporary name renamed into place as
/// [`SolutionWriter`] does.
pub fn write_jsonl<T: serde::Serialize>(path: impl AsRef<Path>, items: &[T]) -> Result<()> {
    write_text(path.as_ref(), items, false)
}

/// Write JSON records to `path` as its name says: JSONL (default), one JSON array (`.json`) or
/// Parquet (`.parquet`, columns from the records' fields), under a temporary name renamed into
/// place as [`SolutionWriter`] does; `-` is standard output.
pub fn write_records(path: impl AsRef<Path>, records: &[serde_json::Value]) -> Result<()> {
    let path = path.as_ref();
    check_output_name(path)?;
    if is_parquet(path) {
        let output = Output::prepare(path)?;
        write_parquet(output.writing(), records).map_err(|message| Error::Other {
            file: path.to_path_buf(),
            message,
        })?;
        return output.commit();
    }
    write_text(path, records, path.extension().is_some_and(|e| e == "json"))
}

/// `items` as JSON lines, or as one JSON array (`array`), to `path` ([`Output`]).
fn write_text<T: serde::Serialize>(path: &Path, items: &[T], array: bool) -> Result<()> {
    let output = Output::prepare(path)?;
    let io_err = |source| Error::Io {
        file: path.to_path_buf(),
        source,
    };
    let mut w = BufWriter::new(output.open()?);
    for (i, v) in items.iter().enumerate() {
        if array {
            w.write_all(if i == 0 { b"[\n" } else { b",\n" }).map_err(io_err)?;
        }
        serde_json::to_writer(&mut w, v).map_err(|e| io_err(e.into()))?;
        if !array {
            w.write_all(b"\n").map_err(io_err)?;
        }
    }
    if array {
        w.write_all(if items.is_empty() { b"[]\n" } else { b"\n]\n" })
            .map_err(io_err)?;
    }
    w.flush().map_err(io_err)?;
    drop(w);
    output.commit()
}

/// Problems from the records of a JSONL, JSON or Parquet file (GSM8K's and MATH-500's files as
/// they are), with `question` (or `problem`), an optional `id` and a gold answer
/// in `gold_answer` or `answer` (GSM8K's `#### N` is understood); errors name file and line.
pub fn read_problems(path: &Path) -> Result<Vec<crate::Problem>> {
    let mut out = Vec::new();
    let mut lines: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let at = |line: usize, source: RecordError| Error::Record {
        file: path.to_path_buf(),
        line,
        source,
    };
    for (line, rec) in raw_records(path)? {
        let v = rec.map_err(|e| at(line, e))?;
        let problem = crate::Problem::from_record(&v).map_err(|e| at(line, e.into()))?;
        if let Some(first) = lines.insert(problem.id.clone(), line) {
            return Err(Error::Other {
                file: path.to_path_buf(),
                message: format!(
                    "line {line}: field `id`: `{}` is the id of line {first} too (problem ids must be unique; a \
question repeated without ids gets the same id)",
                    problem.id
                ),
            });
        }
        out.push(problem);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line over the limit is one error at its line number, and the read ends there, with the
    /// records before it kept.
    #[test]
    fn an_over_long_line_ends_the_read_with_an_error() {
        let limit = 1 << 20;
        let mut text = String::from("{\"a\": 1}\n");
        text.push_str(&"x".repeat(limit + 10));
        text.push_str("\n{\"a\": 2}\n");
        let lines = JsonLines::new(Box::new(io::Cursor::new(text.into_bytes())), limit);
        let got: Vec<RawRecord> = lines.collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].1.as_ref().unwrap()["a"], 1);
        let err = got[1].1.as_ref().unwrap_err().to_string();
        assert_eq!(got[1].0, 2);
        assert!(err.contains("longer than 1 MiB"), "{err}");
        // A line exactly at the limit is read (and is invalid JSON here, not too long).
        let exact = format!("{}\n", "y".repeat(limit - 1));
        let got: Vec<RawRecord> = JsonLines::new(Box::new(io::Cursor::new(exact.into_bytes())), limit).collect();
        assert!(got[0].1.as_ref().unwrap_err().to_string().contains("invalid JSON"));
    }
}
