//! Where a model runs: the CPU engine, or a CUDA GPU (builds with the `cuda` feature); the
//! commands' `--device`.

use anyhow::{bail, Result};

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// The first CUDA GPU when this build has CUDA and a GPU answers, else the CPU.
    #[default]
    Auto,
    /// The CPU engine.
    Cpu,
    /// CUDA GPU `n` (`cuda:n`).
    Cuda(usize),
}

impl std::str::FromStr for Placement {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "auto" => Placement::Auto,
            "cpu" => Placement::Cpu,
            "cuda" | "gpu" => Placement::Cuda(0),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Placement::Cuda(n),
                _ => bail!("unknown device `{other}`: use auto, cpu, cuda or cuda:N"),
            },
        })
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Auto => f.write_str("auto"),
            Placement::Cpu => f.write_str("cpu"),
            Placement::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Placement {
    /// `Auto` decided (a GPU when this build has CUDA and the driver reports one); `Cuda` in a
    /// build without CUDA is an error saying how to get one.
    pub fn resolve(self) -> Result<Placement> {
        match self {
            Placement::Cpu => Ok(Placement::Cpu),
            Placement::Auto => Ok(if cuda_devices() > 0 {
                Placement::Cuda(0)
            } else {
                Placement::Cpu
            }),
            Placement::Cuda(n) => {
                if !cfg!(feature = "cuda") {
                    bail!(
                        "device cuda:{n}: this stepwise was built without CUDA (the command line: \
                         `cargo build --release -p stepwise-cli --features cuda`; the Python \
                         package: `MATURIN_PEP517_ARGS=\"--features cuda\" pip install ./python`)"
                    );
                }
                Ok(Placement::Cuda(n))
            }
        }
    }

    /// Whether it is a GPU.
    pub fn is_cuda(self) -> bool {
        matches!(self, Placement::Cuda(_))
    }
}

/// GPUs the driver reports (0 without the `cuda` feature or a driver).
pub fn cuda_devices() -> usize {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_devices() {
        for (text, want) in [
            ("auto", Placement::Auto),
            ("cpu", Placement::Cpu),
            ("cuda", Placement::Cuda(0)),
            ("cuda:3", Placement::Cuda(3)),
        ] {
            let got: Placement = text.parse().unwrap();
            assert_eq!(got, want);
        }
        assert_eq!(Placement::Cuda(2).to_string(), "cuda:2");
        assert!("tpu".parse::<Placement>().is_err());
        assert!("cuda:x".parse::<Placement>().is_err());
        assert_eq!(Placement::Cpu.resolve().unwrap(), Placement::Cpu);
        #[cfg(not(feature = "cuda"))]
        {
            assert_eq!(Placement::Auto.resolve().unwrap(), Placement::Cpu);
            let err = Placement::Cuda(0).resolve().unwrap_err().to_string();
            assert!(err.contains("--features cuda") && err.contains("pip install"), "{err}");
        }
    }
}
