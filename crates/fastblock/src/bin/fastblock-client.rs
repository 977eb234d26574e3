//! `fastblock-client`: the admin CLI. See `fastblock-client --help` and `docs/cli.md`.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let code = fastblock_cli::run(argv, &mut out, &mut err).await;
    std::process::exit(code);
}
