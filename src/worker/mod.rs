//! The JAX worker: the Python environment it runs in (`pyenv`), the process
//! and its restarts (`process`), the framed wire protocol and the requests
//! (`protocol`), and what a `run` returns (`outputs`).

pub mod outputs;
pub mod process;
pub mod protocol;
pub mod pyenv;
