//! Parquet files of any record layout, through arrow: JSON records are turned into columns with an
//! inferred schema (nested lists and structs included), the layout Hugging Face `datasets` loads
//! with `load_dataset("parquet", data_files=...)`, and read back into JSON records. Behind the
//! `parquet` feature (on by default); without it, reading or writing a `.parquet` path is an error
//! that says so.

use std::path::Path;
#[cfg(feature = "parquet")]
pub use with::{batch_to_json, read_parquet, records_to_batches, write_parquet};
#[cfg(not(feature = "parquet"))]
pub use without::{read_parquet, write_parquet};

/// Whether a path names a Parquet file (by extension).
pub fn is_parquet(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

#[cfg(not(feature = "parquet"))]
mod without {
    use serde_json::Value;
    use std::path::Path;

    const MISSING: &str = "Parquet needs stepwise-core's `parquet` feature (built without it)";

    /// Refused: built without the `parquet` feature.
    pub fn write_parquet(_path: &Path, _records: &[Value]) -> Result<(), String> {
        Err(MISSING.into())
    }

    /// Refused: built without the `parquet` feature.
    pub fn read_parquet(_path: &Path) -> Result<std::iter::Empty<Result<Vec<Value>, String>>, String> {
        Err(MISSING.into())
    }
}

#[cfg(feature = "parquet")]
mod with {
    use arrow_array::RecordBatch;
    use arrow_json::{reader::infer_json_schema_from_iterator, writer::LineDelimited, ReaderBuilder, WriterBuilder};
    use parquet::arrow::{arrow_reader::ParquetRecordBatchReaderBuilder, ArrowWriter};
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    use serde_json::Value;
    use std::fs::File;
    use std::path::Path;
    use std::sync::Arc;

    /// JSON object records as Arrow record batches (schema inferred from all rows: nested lists and
    /// structs included; strings as `utf8`, arrays as `list`, booleans as `bool`), at most 8192 rows a
    /// batch.
    pub fn records_to_batches(records: &[Value]) -> Result<(Arc<arrow_schema::Schema>, Vec<RecordBatch>), String> {
        let schema =
            infer_json_schema_from_iterator(records.iter().map(Ok)).map_err(|e| format!("inferring a schema: {e}"))?;
        let schema = Arc::new(schema);
        let mut decoder = ReaderBuilder::new(schema.clone())
            .with_batch_size(8192)
            .build_decoder()
            .map_err(|e| e.to_string())?;
        let mut batches = Vec::new();
        for chunk in records.chunks(8192) {
            decoder
                .serialize(chunk)
                .map_err(|e| format!("converting records to columns: {e}"))?;
            if let Some(batch) = decoder.flush().map_err(|e| e.to_string())? {
                batches.push(batch);
            }
        }
        Ok((schema, batches))
    }

    /// Write JSON object records to a Parquet file (snappy-compressed, schema inferred from all rows).
    pub fn write_parquet(path: &Path, records: &[Value]) -> Result<(), String> {
        let (schema, batches) = records_to_batches(records)?;
        let file = File::create(path).map_err(|e| e.to_string())?;
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let mut writer = ArrowWriter::try_new(file, schema, Some(props)).map_err(|e| e.to_string())?;
        for batch in &batches {
            writer.write(batch).map_err(|e| e.to_string())?;
        }
        writer.close().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Read a Parquet file as JSON object records, one batch at a time.
    pub fn read_parquet(path: &Path) -> Result<impl Iterator<Item = Result<Vec<Value>, String>>, String> {
        let file = File::open(path).map_err(|e| e.to_string())?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_batch_size(4096).build())
            .map_err(|e| format!("not a readable Parquet file: {e}"))?;
        Ok(reader.map(|batch| batch.map_err(|e| e.to_string()).and_then(|b| batch_to_json(&b))))
    }

    /// An Arrow record batch as JSON object records. A null field of a row is left out of its
    /// object (at any depth; nulls in lists stay): Arrow holds a field that some records lack as
    /// null in those, where the records had no such field (a table of records scored and
    /// unscored has `scores.prm` null in the unscored ones).
    pub fn batch_to_json(batch: &RecordBatch) -> Result<Vec<Value>, String> {
        let mut buf = Vec::new();
        let mut w = WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, LineDelimited>(&mut buf);
        w.write(batch).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        drop(w);
        buf.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).map(without_nulls).map_err(|e| e.to_string()))
            .collect()
    }

    fn without_nulls(v: Value) -> Value {
        match v {
            Value::Object(o) => Value::Object(
                o.into_iter()
                    .filter(|(_, x)| !x.is_null())
                    .map(|(k, x)| (k, without_nulls(x)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
            other => other,
        }
    }
}
