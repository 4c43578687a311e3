//! Checks of the source tree's shape, not of what it does: within each
//! crate no two files import each other, directly or round a loop, so a
//! reader can take the files of a crate in one order, each depending only
//! on those before it; the README stays a quick start whose links, and
//! those of every page behind it, lead somewhere; and every block of shell
//! commands in the README and docs/ is run by a test (or a script CI runs)
//! or says on the line before it that it is not, and why.
//!
//! "Imports" are the paths a file names (`use` trees and paths in code:
//! `crate::…`, `super::…`, `self::…`, a child module's name), resolved to
//! the file of the longest module they name. Not counted: comments and
//! string literals, `#[cfg(test)] mod …` blocks (a test may reach into a
//! sibling), and a crate root's or a `mod.rs`'s `pub use` of its own child
//! modules (the facade a module shows, not something it depends on).
//! Binaries (`main.rs`, `src/bin/`) are roots of their own and not walked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ferry_testkit::repo_root;

/// The most lines the README may have: a quick start, with `docs/` behind it.
const README_MAX_LINES: usize = 250;

/// Lines of a production function (signature to closing brace) beyond
/// which its doc comment says why it is long ("Long on purpose: …").
const FUNCTION_MAX_LINES: usize = 110;

/// A module's path inside its crate: `["fleet", "catalog"]`; the crate
/// root is empty.
type ModulePath = Vec<String>;

#[test]
fn no_file_imports_another_that_imports_it_back() {
    let mut loops = Vec::new();
    for member in workspace_members() {
        let src = repo_root().join(&member).join("src");
        let files = module_files(&src);
        let graph: BTreeMap<ModulePath, BTreeSet<ModulePath>> =
            files.iter().map(|(module, path)| (module.clone(), imports(module, path, &files))).collect();
        for component in strongly_connected(&graph) {
            let edges: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| component.contains(*to))
                        .map(move |to| format!("{} -> {}", display(from), display(to)))
                })
                .collect();
            loops.push(format!("{member}: {}", edges.join(", ")));
        }
    }
    assert!(
        loops.is_empty(),
        "files that import each other (move the shared names to where they belong):\n{}",
        loops.join("\n")
    );
}

#[test]
fn the_checker_sees_a_loop_through_a_use_tree_and_a_child_path() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("fleet")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod fleet;\npub use fleet::Catalog;\n").unwrap();
    std::fs::write(src.join("fleet/mod.rs"), "mod catalog;\nmod spill;\npub use catalog::Catalog;\n").unwrap();
    std::fs::write(
        src.join("fleet/catalog.rs"),
        "// use super::spill::Nothing;\nuse super::{spill::{Run, Held}};\nconst S: &str = \"crate::fleet::spill\";\n",
    )
    .unwrap();
    std::fs::write(src.join("fleet/spill.rs"), "pub struct Run(crate::fleet::catalog::Catalog);\n").unwrap();
    let files = module_files(src);
    let graph: BTreeMap<ModulePath, BTreeSet<ModulePath>> =
        files.iter().map(|(module, path)| (module.clone(), imports(module, path, &files))).collect();
    let catalog = vec!["fleet".to_owned(), "catalog".to_owned()];
    let spill = vec!["fleet".to_owned(), "spill".to_owned()];
    assert_eq!(strongly_connected(&graph), vec![BTreeSet::from([catalog.clone(), spill.clone()])]);
    // The facade's re-export is not a dependency of the crate root.
    assert!(graph[&Vec::new()].is_empty(), "{graph:?}");

    // Without the path in code, only the comment and the string name it back.
    std::fs::write(src.join("fleet/spill.rs"), "// crate::fleet::catalog\npub struct Run;\n").unwrap();
    let files = module_files(src);
    assert!(imports(&spill, &files[&spill], &files).is_empty());
    assert!(imports(&catalog, &files[&catalog], &files).contains(&spill));
}

#[test]
fn a_long_production_function_says_why_it_is_long() {
    let mut unexplained = Vec::new();
    for member in workspace_members().into_iter().filter(|m| !m.starts_with("tests/") && m != "testkit") {
        let src = repo_root().join(&member).join("src");
        for path in module_files(&src).into_values() {
            let name = path.file_name().unwrap().to_string_lossy();
            if name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for (function, lines) in long_functions(&source) {
                unexplained.push(format!(
                    "{}: fn {function}, {lines} lines",
                    path.strip_prefix(repo_root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "functions over {FUNCTION_MAX_LINES} lines whose doc comment does not say \"Long on purpose\" (split them, or say why not):\n{}",
        unexplained.join("\n")
    );
}

#[test]
fn a_long_function_is_found_unless_its_doc_says_why() {
    let body = "    let x = 1;\n".repeat(FUNCTION_MAX_LINES);
    let unexplained = format!("/// Does it.\npub async fn long(a: u8) -> u8 {{\n{body}}}\n");
    assert_eq!(long_functions(&unexplained), [("long".to_owned(), FUNCTION_MAX_LINES + 2)]);
    let explained = format!("/// Does it.\n///\n/// Long on purpose: a table.\nfn long() {{\n{body}}}\n");
    assert!(long_functions(&explained).is_empty());
    let in_tests = format!("#[cfg(test)]\nmod tests {{\n    fn long() {{\n{body}    }}\n}}\n");
    assert!(long_functions(&in_tests).is_empty());
}

/// The functions of `source`, outside its test module, longer than
/// [`FUNCTION_MAX_LINES`] whose doc comment gives no reason, with their
/// lengths. A function ends at the first `}` at its own indentation.
fn long_functions(source: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let end = lines
        .windows(2)
        .position(|pair| pair[0].trim() == "#[cfg(test)]" && pair[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    let mut long = Vec::new();
    for (at, line) in lines[..end].iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let Some(name) = function_name(trimmed) else { continue };
        let Some(close) = lines[at + 1..end]
            .iter()
            .position(|l| l.len() > indent && l[..indent].trim().is_empty() && l[indent..].starts_with('}'))
        else {
            continue;
        };
        let length = close + 2;
        let doc = lines[..at].iter().rev().take_while(|l| {
            let l = l.trim_start();
            l.starts_with("///") || l.starts_with("#[")
        });
        if length > FUNCTION_MAX_LINES && !doc.into_iter().any(|l| l.contains("Long on purpose")) {
            long.push((name, length));
        }
    }
    long
}

/// The name of the function a line declares with a body, if it does.
fn function_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.next() {
        match word {
            "pub" | "async" | "const" | "unsafe" | "extern" => {}
            _ if word.starts_with("pub(") => {}
            "fn" => {
                let name: String = words.next()?.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                return (!line.trim_end().ends_with(';')).then_some(name);
            }
            _ => return None,
        }
    }
    None
}

#[test]
fn the_readme_is_a_quick_start_and_every_relative_link_leads_somewhere() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines: move the detail into docs/ (at most {README_MAX_LINES})"
    );
    let mut broken = Vec::new();
    for page in markdown_pages(&root) {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in relative_links(&text) {
            if let Err(why) = resolves(&page, &target) {
                broken.push(format!("{}: ({target}) {why}", page.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "links that lead nowhere:\n{}", broken.join("\n"));
}

#[test]
fn a_link_checks_its_file_and_its_heading_as_github_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "# Using `ferry-stager`\n## What it guarantees\n## What it guarantees\n```sh\n# not a heading\n```\n",
    )
    .unwrap();
    assert_eq!(resolves(&page, "#using-ferry-stager"), Ok(()));
    assert_eq!(resolves(&page, "page.md#what-it-guarantees-1"), Ok(()));
    assert!(resolves(&page, "#not-a-heading").is_err());
    assert!(resolves(&page, "gone.md").is_err());
    let text = "[a](page.md) [b](https://example.com) ![c](#x)\n```\n[d](inside.md)\n```\n";
    assert_eq!(relative_links(text), ["page.md", "#x"]);
}

/// The test that runs the README's quick start as written.
const QUICK_START_TEST: &str = "the_readme_quick_start_as_written_stages_data_and_a_training_job_reads_it";

#[test]
fn every_command_in_the_docs_is_run_by_a_test_or_says_it_is_not() {
    let root = repo_root();
    let mut pages: Vec<PathBuf> = markdown_pages(&root.join("docs"));
    pages.extend([root.join("README.md"), root.join("CONTRIBUTING.md")]);
    let sources = rust_sources(&root);
    let mut unmarked = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        for (line, marker) in command_blocks(&text) {
            let problem = match marker {
                Marker::QuickStart if name == "README.md" => {
                    (!sources.iter().any(|s| s.contains(&format!("fn {QUICK_START_TEST}("))))
                        .then(|| format!("the quick start's test {QUICK_START_TEST} is gone"))
                }
                Marker::RunBy(by) => (!runs(&root, &sources, &by)).then(|| format!("`run by {by}`: no such file or test")),
                Marker::NotRun => None,
                Marker::QuickStart | Marker::Missing => Some(
                    "a command block needs `<!-- commands: run by PATH-OR-TEST … -->` or `<!-- commands: not run … -->` \
                     on the line before it"
                        .to_owned(),
                ),
            };
            if let Some(problem) = problem {
                unmarked.push(format!("{name}:{line}: {problem}"));
            }
        }
    }
    assert!(unmarked.is_empty(), "commands in the docs nobody runs or marks:\n{}", unmarked.join("\n"));
}

#[test]
fn a_command_block_is_marked_on_the_line_before_it() {
    let text = "## Quick start\n```sh\nhelm install\n```\n## Next\n<!-- commands: not run (your cluster) -->\n\
                ```sh\nkubectl get\n```\n<!-- commands: run by .ci/run -->\n```bash\nhack/test.sh\n```\n\
                ```sh\nunmarked\n```\n```yaml\nnot: a command\n```\n";
    let found: Vec<(usize, Marker)> = command_blocks(text);
    assert_eq!(
        found,
        [(2, Marker::QuickStart), (7, Marker::NotRun), (11, Marker::RunBy(".ci/run".into())), (14, Marker::Missing)]
    );
}

/// What the line before a command block says of it.
#[derive(Debug, PartialEq, Eq)]
enum Marker {
    /// A block of the README's Quick start section, which a test runs.
    QuickStart,
    /// `<!-- commands: run by X … -->`: X is a file (a script) or a test's name.
    RunBy(String),
    /// `<!-- commands: not run … -->`, with the reason.
    NotRun,
    /// Nothing.
    Missing,
}

/// The shell blocks of a page (`sh`, `bash`, `shell`, `console`): their
/// line numbers, from 1, and what the line before each says.
fn command_blocks(text: &str) -> Vec<(usize, Marker)> {
    let mut found = Vec::new();
    let (mut inside, mut section, mut before) = (false, String::new(), "");
    for (index, line) in text.lines().enumerate() {
        if let Some(info) = line.strip_prefix("```") {
            if !inside && matches!(info.trim(), "sh" | "bash" | "shell" | "console") {
                let marker = match before.trim().strip_prefix("<!-- commands:").map(str::trim) {
                    Some(rest) if rest.starts_with("not run") => Marker::NotRun,
                    Some(rest) if rest.starts_with("run by ") => {
                        Marker::RunBy(rest["run by ".len()..].split_whitespace().next().unwrap_or_default().to_owned())
                    }
                    _ if section == "Quick start" => Marker::QuickStart,
                    _ => Marker::Missing,
                };
                found.push((index + 1, marker));
            }
            inside = !inside;
        } else if !inside && let Some(heading) = line.strip_prefix("## ") {
            section = heading.trim().to_owned();
        }
        if !inside && !line.trim().is_empty() {
            before = line;
        }
    }
    found
}

/// Whether `by` names a file of the repository or a test function.
fn runs(root: &Path, sources: &[String], by: &str) -> bool {
    if by.contains('/') { root.join(by).exists() } else { sources.iter().any(|s| s.contains(&format!("fn {by}("))) }
}

/// The text of every Rust file of the repository.
fn rust_sources(root: &Path) -> Vec<String> {
    files_ending(root, ".rs").iter().map(|path| std::fs::read_to_string(path).unwrap()).collect()
}

/// Every Markdown page of the repository (not under `target/` or a hidden
/// directory).
fn markdown_pages(root: &Path) -> Vec<PathBuf> {
    files_ending(root, ".md")
}

/// Every file below `root` whose name ends with `suffix` (not under
/// `target/` or a hidden directory), sorted.
fn files_ending(root: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    pending.push(path);
                }
            } else if name.ends_with(suffix) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The targets of a page's inline links and images that are not URLs,
/// outside code blocks.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for line in outside_code_blocks(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
                links.push(target.to_owned());
            }
            rest = &after[end..];
        }
    }
    links
}

/// Whether `target`, linked from `page`, names a file or directory that
/// exists and, after `#`, a heading of it.
fn resolves(page: &Path, target: &str) -> Result<(), String> {
    let (file, anchor) = target.split_once('#').map_or((target, None), |(file, anchor)| (file, Some(anchor)));
    let file = if file.is_empty() { page.to_path_buf() } else { page.parent().unwrap().join(file) };
    if !file.exists() {
        return Err("no such file".to_owned());
    }
    let Some(anchor) = anchor else { return Ok(()) };
    let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
    if heading_anchors(&text).contains(anchor) { Ok(()) } else { Err(format!("no heading #{anchor}")) }
}

/// The anchors GitHub gives a page's headings: lower case, punctuation
/// dropped, spaces as `-`, a repeated one numbered `-1`, `-2`, ….
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for line in outside_code_blocks(text) {
        let Some(title) = line.strip_prefix('#').map(|l| l.trim_start_matches('#')) else { continue };
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut repeat = 0;
        while anchors.contains(&anchor) {
            repeat += 1;
            anchor = format!("{slug}-{repeat}");
        }
        anchors.insert(anchor);
    }
    anchors
}

/// The lines of a page outside its fenced code blocks.
fn outside_code_blocks(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The workspace's member directories, from the root `Cargo.toml`.
fn workspace_members() -> Vec<String> {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).and_then(|rest| rest.split(']').next()).expect("members");
    members.split(',').map(|m| m.trim().trim_matches('"').to_owned()).filter(|m| !m.is_empty()).collect()
}

/// Every library file under `src`, by module path.
fn module_files(src: &Path) -> BTreeMap<ModulePath, PathBuf> {
    let mut files = BTreeMap::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative: Vec<String> = path
                .strip_prefix(src)
                .unwrap()
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path.is_dir() {
                if relative != ["bin"] {
                    pending.push(path);
                }
                continue;
            }
            let Some(stem) = relative.last().and_then(|name| name.strip_suffix(".rs")) else { continue };
            if relative == ["main.rs"] {
                continue;
            }
            let mut module = relative[..relative.len() - 1].to_vec();
            if !matches!(stem, "mod" | "lib") {
                module.push(stem.to_owned());
            }
            files.insert(module, path);
        }
    }
    files
}

/// The modules of `files` that `module` (at `path`) names, itself excluded.
fn imports(module: &ModulePath, path: &Path, files: &BTreeMap<ModulePath, PathBuf>) -> BTreeSet<ModulePath> {
    let source = std::fs::read_to_string(path).unwrap();
    let is_root = matches!(path.file_name().and_then(|n| n.to_str()), Some("mod.rs" | "lib.rs"));
    let tokens = without_test_modules(&tokens(&source));
    let mut named = BTreeSet::new();
    let mut at = 0;
    while at < tokens.len() {
        // A `use` tree, expanded into full paths.
        if tokens[at] == "use" {
            let end = tokens[at..].iter().position(|t| t == ";").map_or(tokens.len(), |p| at + p);
            let public = at > 0 && (tokens[at - 1] == "pub" || tokens[at - 1] == ")");
            for used in expand_use(&tokens[at + 1..end]) {
                // `pub use child::Name` (or `self::child::Name`) in a module root.
                let child = used.iter().find(|segment| *segment != "self").map(|first| {
                    let mut child = module.clone();
                    child.push(first.clone());
                    child
                });
                let re_exports_child = is_root && public && child.is_some_and(|child| files.contains_key(&child));
                if !re_exports_child {
                    named.extend(resolve(module, &used, files));
                }
            }
            at = end + 1;
            continue;
        }
        // A path in code: identifiers joined by `::`, not itself the tail
        // of a longer path.
        if is_identifier(&tokens[at])
            && tokens.get(at + 1).is_some_and(|t| t == "::")
            && (at == 0 || tokens[at - 1] != "::")
        {
            let mut path = vec![tokens[at].clone()];
            let mut next = at + 1;
            while tokens.get(next).is_some_and(|t| t == "::") && tokens.get(next + 1).is_some_and(|t| is_identifier(t))
            {
                path.push(tokens[next + 1].clone());
                next += 2;
            }
            named.extend(resolve(module, &path, files));
            at = next;
            continue;
        }
        at += 1;
    }
    named.remove(module);
    named
}

/// The file `path` (as written in `module`) leads to, if it names one of
/// this crate's modules.
fn resolve(module: &ModulePath, path: &[String], files: &BTreeMap<ModulePath, PathBuf>) -> Option<ModulePath> {
    let mut segments = path.iter().peekable();
    let mut base: ModulePath = match segments.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("self") => {
            segments.next();
            module.clone()
        }
        Some("super") => {
            let mut base = module.clone();
            while segments.peek().is_some_and(|s| *s == "super") {
                segments.next();
                base.pop();
            }
            base
        }
        // A child module's name, written without `self::`.
        Some(first) => {
            let mut child = module.clone();
            child.push(first.to_owned());
            if !files.contains_key(&child) {
                return None;
            }
            module.clone()
        }
        None => return None,
    };
    let mut found = files.contains_key(&base).then(|| base.clone());
    for segment in segments {
        base.push(segment.clone());
        if files.contains_key(&base) {
            found = Some(base.clone());
        }
    }
    found
}

/// The paths a `use` tree (the tokens between `use` and `;`) names:
/// `crate::{a::B, c}` is `crate::a::B` and `crate::c`.
fn expand_use(tree: &[String]) -> Vec<Vec<String>> {
    fn walk(tree: &[String], prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut at = 0;
        while at < tree.len() {
            match tree[at].as_str() {
                "::" => {}
                // `a::B as C`: the path is `a::B`.
                "as" => at += 1,
                "{" => {
                    // Split the group's items at its top-level commas.
                    let mut depth = 0;
                    let mut start = at + 1;
                    for i in at + 1..tree.len() {
                        match tree[i].as_str() {
                            "{" => depth += 1,
                            "}" if depth > 0 => depth -= 1,
                            "," | "}" if depth == 0 => {
                                walk(&tree[start..i], &path, out);
                                start = i + 1;
                                if tree[i] == "}" {
                                    return;
                                }
                            }
                            _ => {}
                        }
                    }
                    return;
                }
                token => path.push(token.to_owned()),
            }
            at += 1;
        }
        if path.len() > prefix.len() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk(tree, &[], &mut out);
    out
}

/// Identifiers, `::` and single punctuation characters of `source`, with
/// comments, string and character literals left out.
fn tokens(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        let next = chars.get(at + 1).copied();
        if c == '/' && next == Some('/') {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while at < chars.len() {
                if chars[at] == '/' && chars.get(at + 1) == Some(&'*') {
                    depth += 1;
                    at += 2;
                } else if chars[at] == '*' && chars.get(at + 1) == Some(&'/') {
                    depth -= 1;
                    at += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    at += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !previous_is_identifier(&chars, at) {
            // A raw string: r"…", r#"…"#.
            let hashes = chars[at + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(at + 1 + hashes) != Some(&'"') {
                tokens.push("r".to_owned());
                at += 1;
                continue;
            }
            at += hashes + 2;
            while at < chars.len()
                && !(chars[at] == '"' && chars[at + 1..].iter().take(hashes).filter(|c| **c == '#').count() == hashes)
            {
                at += 1;
            }
            at += hashes + 1;
        } else if c == '"' {
            at += 1;
            while at < chars.len() && chars[at] != '"' {
                at += if chars[at] == '\\' { 2 } else { 1 };
            }
            at += 1;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{1F600}'), or a lifetime.
            if next == Some('\\') {
                at += 2;
                while at < chars.len() && chars[at] != '\'' {
                    at += 1;
                }
                at += 1;
            } else if chars.get(at + 2) == Some(&'\'') {
                at += 3;
            } else {
                at += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = at;
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                at += 1;
            }
            tokens.push(chars[start..at].iter().collect());
        } else if c == ':' && next == Some(':') {
            tokens.push("::".to_owned());
            at += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
            at += 1;
        }
    }
    tokens
}

fn previous_is_identifier(chars: &[char], at: usize) -> bool {
    at > 0 && (chars[at - 1].is_alphanumeric() || chars[at - 1] == '_')
}

/// `tokens` without the items of `#[cfg(test)] mod NAME { … }`.
fn without_test_modules(tokens: &[String]) -> Vec<String> {
    const TEST_MODULE: [&str; 8] = ["#", "[", "cfg", "(", "test", ")", "]", "mod"];
    let mut kept = Vec::with_capacity(tokens.len());
    let mut at = 0;
    while at < tokens.len() {
        let starts_test_module = tokens.len() >= at + TEST_MODULE.len()
            && tokens[at..at + TEST_MODULE.len()].iter().zip(TEST_MODULE).all(|(t, expected)| t == expected)
            && tokens.get(at + TEST_MODULE.len() + 1).is_some_and(|t| t == "{");
        if !starts_test_module {
            kept.push(tokens[at].clone());
            at += 1;
            continue;
        }
        let mut depth = 0;
        at += TEST_MODULE.len() + 1;
        while at < tokens.len() {
            match tokens[at].as_str() {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if depth == 0 {
                        at += 1;
                        break;
                    }
                }
                _ => {}
            }
            at += 1;
        }
    }
    kept
}

fn is_identifier(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The strongly connected components of more than one module (Tarjan).
fn strongly_connected(graph: &BTreeMap<ModulePath, BTreeSet<ModulePath>>) -> Vec<BTreeSet<ModulePath>> {
    struct State<'g> {
        graph: &'g BTreeMap<ModulePath, BTreeSet<ModulePath>>,
        index: BTreeMap<&'g ModulePath, usize>,
        low: BTreeMap<&'g ModulePath, usize>,
        stack: Vec<&'g ModulePath>,
        components: Vec<BTreeSet<ModulePath>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g ModulePath) {
        let index = state.index.len();
        state.index.insert(node, index);
        state.low.insert(node, index);
        state.stack.push(node);
        for next in state.graph.get(node).into_iter().flatten() {
            let Some((next, _)) = state.graph.get_key_value(next) else { continue };
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.stack.contains(&next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = state.stack.pop() {
                component.insert(member.clone());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                state.components.push(component);
            }
        }
    }
    let mut state =
        State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), components: Vec::new() };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.components
}

fn display(module: &ModulePath) -> String {
    if module.is_empty() { "lib".to_owned() } else { module.join("::") }
}
