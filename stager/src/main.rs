//! The `ferry-stager` binary: parse arguments, set up logging, run.

use std::process::ExitCode;

use clap::Parser as _;
use ferry_stager::cli::{Cli, LogFormat, run};

use ferry_stager::progress::LogWriter;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,aws_config=error,aws_smithy_runtime=warn,aws_sdk_s3=warn"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(LogWriter);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let runtime = ferry_engine::runtime::builder().build().expect("tokio runtime");
    runtime.block_on(run(cli))
}
