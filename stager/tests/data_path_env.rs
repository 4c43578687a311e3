//! `FERRY_S3_DATA_PATH`, the S3 data-path ablation knob (engine
//! `store::s3`), reaches the store the stager builds: a push and a pull
//! through each data path say so in the log and move the bytes, and a value
//! that names no data path is refused loudly while the run goes on through
//! the default (hyper). The data paths themselves are tested in the
//! engine's `tests/data_paths.rs`.

mod common;

use std::collections::BTreeMap;

use common::{command, run, write_tree};
use ferry_engine::store::s3::DATA_PATH_ENV;
use ferry_testkit::{Backend, Store, pattern, read_tree};

#[test]
fn the_data_path_is_chosen_by_the_environment_and_an_unknown_one_is_refused_loudly() {
    let server = Store::start(Backend::Minio);
    tokio::runtime::Runtime::new().unwrap().block_on(server.create_bucket("knob"));
    let files: BTreeMap<String, Vec<u8>> =
        [("a.bin".to_owned(), pattern(1, 6 << 20)), ("b.txt".to_owned(), b"b".to_vec())].into();
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &files);

    // The store module logs which path carries the data, and refuses a bad value.
    let with_data_path = |command: &mut std::process::Command, value: &str| {
        command.env(DATA_PATH_ENV, value).env("RUST_LOG", "warn,ferry_engine::store::s3=info").env("NO_COLOR", "1");
    };
    for (value, logged) in [
        ("sdk", &["data_path=sdk"][..]),
        ("hyper", &["data_path=hyper"]),
        ("object_store", &["data_path=object_store"]),
        ("reqwest", &["FERRY_S3_DATA_PATH='reqwest' is not one of sdk, hyper, object_store", "data_path=hyper"]),
    ] {
        let uri = server.uri(&format!("knob/{value}"));
        let mut push = command(&server, &["push", src.path().to_str().unwrap(), uri.as_str(), "--part-size", "5MiB"]);
        with_data_path(&mut push, value);
        let push = run(push);
        push.assert_ok();
        for logged in logged {
            assert!(push.stderr.contains(logged), "{value}: '{logged}' not in the log:\n{}", push.stderr);
        }

        let dst = tempfile::tempdir().unwrap();
        let mut pull = command(&server, &["pull", uri.as_str(), dst.path().to_str().unwrap()]);
        with_data_path(&mut pull, value);
        let pull = run(pull);
        pull.assert_ok();
        for logged in logged {
            assert!(pull.stderr.contains(logged), "{value}: '{logged}' not in the log:\n{}", pull.stderr);
        }
        assert_eq!(pull.summary["verified"]["checksum"].as_u64(), Some(2), "{:#}", pull.summary);
        assert!(read_tree(dst.path()) == files, "{value}: the tree differs after the round trip");
    }
}
