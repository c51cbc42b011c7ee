//! The `grpo-verify` binary: parses the command line (`cli::Cli`), runs the
//! command, and maps its outcome to the exit codes of `docs/cli.md`
//! (0 everything held, 1 a verification failure, 2 bad usage or input).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    grpo_verify::memory::keep_freed_memory();
    let cli = match grpo_verify::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match grpo_verify::cli::run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("grpo-verify: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
