//! A safetensors file read a tensor at a time, into one buffer reused for every tensor: neither
//! read whole (an all-linear rank-16 adapter of a 0.5B model is 35 MB of f32: that much fresh
//! memory the kernel zeroes, page by page, at every load of a new adapter, most of the time such
//! a load took) nor mapped (a trainer rewriting the file while a server maps it would kill the
//! server with `SIGBUS`; a read only fails). What `stepwise serve` reads adapters with
//! ([`crate::Model::load_adapter`]), while they change on disk beside it.

use anyhow::{ensure, Context, Result};
use safetensors::tensor::{Metadata, TensorView};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A header this large is refused (safetensors' own limit).
const MAX_HEADER: u64 = 100_000_000;

/// An open safetensors file and its header.
pub(crate) struct TensorFile {
    path: PathBuf,
    file: File,
    meta: Metadata,
    /// Where the tensors' bytes begin (after the header).
    data: u64,
    /// The file's length when opened: a tensor reaching past it is an error, not a short read.
    len: u64,
    buf: Vec<u8>,
}

impl TensorFile {
    /// `path` opened and its header read and checked.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let at = || path.display().to_string();
        let mut file = File::open(path).with_context(|| format!("reading {}", at()))?;
        let len = file.metadata().with_context(at)?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .with_context(|| format!("{}: not a safetensors file (shorter than its header)", at()))?;
        let n = u64::from_le_bytes(n);
        ensure!(
            n <= MAX_HEADER && 8 + n <= len,
            "{}: not a safetensors file (a header of {n} bytes in a file of {len})",
            at()
        );
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).with_context(at)?;
        let meta: Metadata = serde_json::from_slice(&header)
            .with_context(|| format!("{}: not a safetensors file (its header)", at()))?;
        Ok(TensorFile {
            path: path.to_path_buf(),
            file,
            meta,
            data: 8 + n,
            len,
            buf: Vec::new(),
        })
    }

    /// Each tensor's shape, by name.
    pub(crate) fn shapes(&self) -> HashMap<String, Vec<usize>> {
        self.meta
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.shape.clone()))
            .collect()
    }

    /// The tensor `name`, read into this file's buffer (its view lasts until the next read).
    pub(crate) fn tensor(&mut self, name: &str) -> Result<TensorView<'_>> {
        let at = format!("{}: tensor `{name}`", self.path.display());
        let info = self.meta.info(name).with_context(|| format!("{at} is missing"))?;
        let (start, end) = info.data_offsets;
        let (dtype, shape) = (info.dtype, info.shape.clone());
        let within = (end as u64).checked_add(self.data).is_some_and(|last| last <= self.len);
        ensure!(start <= end && within, "{at}: its bytes {start}..{end} lie past the file's end");
        self.buf.resize(end - start, 0);
        self.file
            .seek(SeekFrom::Start(self.data + start as u64))
            .and_then(|_| self.file.read_exact(&mut self.buf))
            .with_context(|| format!("{at}: reading its bytes (the file changed?)"))?;
        TensorView::new(dtype, shape, &self.buf).with_context(|| format!("{at}: its bytes do not fit its shape"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;

    fn write(path: &Path) {
        let a: Vec<u8> = [1.5f32, -2.0, 3.25, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [7u16, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = [
            ("a", TensorView::new(Dtype::F32, vec![2, 2], &a).unwrap()),
            ("b", TensorView::new(Dtype::BF16, vec![2], &b).unwrap()),
        ];
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn tensors_are_read_one_at_a_time_and_a_cut_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        write(&path);
        let mut f = TensorFile::open(&path).unwrap();
        assert_eq!(f.shapes()["a"], vec![2, 2]);
        let a = f.tensor("a").unwrap();
        assert_eq!((a.dtype(), a.shape().to_vec()), (Dtype::F32, vec![2, 2]));
        assert_eq!(&a.data()[4..8], &(-2.0f32).to_le_bytes());
        assert_eq!(f.tensor("b").unwrap().data(), &[7, 0, 9, 0]);
        assert!(format!("{:#}", f.tensor("c").unwrap_err()).contains("`c` is missing"));
        // Cut short after it was opened (a trainer rewriting it): an error naming the tensor.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = format!("{:#}", f.tensor("b").unwrap_err());
        assert!(err.contains("tensor `b`"), "{err}");
        // Cut before it was opened: the header says more than the file holds.
        assert!(format!("{:#}", TensorFile::open(&path).unwrap().tensor("b").unwrap_err()).contains("past the file's end"));
        std::fs::write(&path, &bytes[..5]).unwrap();
        assert!(format!("{:#}", TensorFile::open(&path).err().unwrap()).contains("not a safetensors file"));
        std::fs::write(&path, [255u8; 16]).unwrap();
        assert!(format!("{:#}", TensorFile::open(&path).err().unwrap()).contains("not a safetensors file"));
    }
}
