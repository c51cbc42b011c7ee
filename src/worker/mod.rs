//! The JAX worker: the Python environment it runs in (`pyenv`), the process
//! and its framed wire protocol (`process`), and what a `run` returns
//! (`outputs`).

pub mod outputs;
pub mod process;
pub mod pyenv;
