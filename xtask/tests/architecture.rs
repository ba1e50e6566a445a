//! ARCHITECTURE.md's invariants, checked against the code as it is: file and function sizes,
//! no import circle between the files of a crate, the daemon's folders importing only the
//! ones above them, the files that touch BPF maps, and which crates depend on which.
//!
//! The sources are read as Rust (syn), not as text: a `use` inside a function, a path written
//! in full (`crate::pipeline::procinfo::tgid_of(pid)`) and a grouped import all count; test
//! modules (`#[cfg(test)]`, `tests.rs`, `tests/`) do not.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::{spanned::Spanned as _, visit::Visit};

/// Longest production file (lines, inline tests included).
const MAX_FILE_LINES: usize = 1000;
/// Longest function, from `fn` to its closing brace.
const MAX_FN_LINES: usize = 150;

/// The crates whose sources are checked: (crate directory, name as the code spells it).
const CRATES: &[(&str, &str)] = &[
    ("daemon", "ethand"),
    ("exporters", "ethand_exporters"),
    ("perfetto", "ethand_perfetto"),
    ("reader", "ethand_reader"),
    ("snapshot", "ethand_snapshot"),
    ("userspace-probes", "ethand_userspace_probes"),
    ("ebpf/ethand-common", "ethand_common"),
    ("ebpf/ethand-ebpf", "ethand_ebpf"),
    ("xtask", "xtask"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One production source file.
struct Source {
    /// Relative to the repository ("daemon/src/serve/tree.rs").
    path: String,
    /// Its module path in its crate (`serve::tree`; empty for the crate root).
    module: Vec<String>,
    text: String,
    ast: syn::File,
}

fn sources(crate_dir: &str) -> Vec<Source> {
    let src = root().join(crate_dir).join("src");
    let mut out = Vec::new();
    let mut todo = vec![src.clone()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir)
            .expect("read the source folder")
            .flatten()
        {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                if name != "tests" {
                    todo.push(p);
                }
                continue;
            }
            if !name.ends_with(".rs") || name == "tests.rs" {
                continue;
            }
            let rel = p.strip_prefix(&src).expect("under src");
            let mut module: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|c| c.to_string_lossy().to_string())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            // Binaries under src/bin are crates of their own.
            if module.first().map(String::as_str) == Some("bin") {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("read a source file");
            let ast = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("{}: not Rust syn can read: {e}", p.display()));
            out.push(Source {
                path: p.strip_prefix(root()).unwrap_or(&p).display().to_string(),
                module,
                text,
                ast,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let p = a.path();
        if p.is_ident("test") {
            return true;
        }
        p.is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

/// Functions longer than the limit: (lines, name, first line).
#[derive(Default)]
struct LongFns(Vec<(usize, String, usize)>);

impl LongFns {
    fn check(&mut self, name: &syn::Ident, fn_token: proc_macro2::Span, body: proc_macro2::Span) {
        let (from, to) = (fn_token.start().line, body.end().line);
        let lines = to + 1 - from;
        if lines > MAX_FN_LINES {
            self.0.push((lines, name.to_string(), from));
        }
    }
}

impl<'a> Visit<'a> for LongFns {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test_attr(&f.attrs) {
            self.check(&f.sig.ident, f.sig.fn_token.span, f.block.span());
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        self.check(&f.sig.ident, f.sig.fn_token.span, f.block.span());
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(b) = &f.default {
            self.check(&f.sig.ident, f.sig.fn_token.span, b.span());
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_file_over_1000_lines_and_no_function_over_150() {
    let mut big_files = Vec::new();
    let mut long_fns = Vec::new();
    for (dir, _) in CRATES {
        for s in sources(dir) {
            let lines = s.text.lines().count();
            if lines > MAX_FILE_LINES {
                big_files.push(format!("{} ({lines} lines)", s.path));
            }
            let mut v = LongFns::default();
            v.visit_file(&s.ast);
            for (lines, name, at) in v.0 {
                long_fns.push(format!("{}:{at} {name} ({lines} lines)", s.path));
            }
        }
    }
    assert!(
        big_files.is_empty() && long_fns.is_empty(),
        "files over {MAX_FILE_LINES} lines: {big_files:#?}\nfunctions over {MAX_FN_LINES} lines: {long_fns:#?}"
    );
}

/// Every path a file names that starts at its crate's root (`crate::`, `super::`, `self::`)
/// or at another crate of the workspace, outside its test modules.
struct Paths<'s> {
    module: &'s [String],
    found: Vec<Vec<String>>,
}

impl Paths<'_> {
    /// `segments` resolved to a path from the crate root, when it is one.
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut at: Vec<String> = Vec::new();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => rest = &rest[1..],
            Some("super") | Some("self") => {
                // A file's `super` is its parent module (mod.rs files included).
                at = self.module.to_vec();
                while let Some(s) = rest.first().map(String::as_str) {
                    match s {
                        "super" => {
                            at.pop()?;
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            _ => return None,
        }
        at.extend(rest.iter().cloned());
        Some(at)
    }

    fn add(&mut self, segments: Vec<String>) {
        if let Some(p) = self.resolve(&segments) {
            self.found.push(p);
        }
    }
}

fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut v = prefix.clone();
            if n.ident != "self" {
                v.push(n.ident.to_string());
            }
            out.push(v);
        }
        syn::UseTree::Rename(r) => {
            let mut v = prefix.clone();
            v.push(r.ident.to_string());
            out.push(v);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

impl<'a> Visit<'a> for Paths<'_> {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test_attr(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut out = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut out);
        for p in out {
            self.add(p);
        }
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        self.add(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// The files of a crate and, for each, the files of the same crate it names.
fn file_graph(crate_dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(crate_dir);
    let by_module: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|s| (s.module.clone(), s.path.clone()))
        .collect();
    let mut graph = BTreeMap::new();
    for s in &files {
        let mut v = Paths {
            module: &s.module,
            found: Vec::new(),
        };
        v.visit_file(&s.ast);
        let mut to = BTreeSet::new();
        for p in v.found {
            // The deepest module file the path reaches.
            let target = (0..=p.len())
                .rev()
                .find_map(|n| by_module.get(&p[..n]))
                .expect("the crate root is a module");
            // A module's own file, and the crate root (lib.rs only declares and re-exports),
            // are not dependencies.
            if *target != s.path && !by_module.get(&Vec::new()).is_some_and(|r| r == target) {
                to.insert(target.clone());
            }
        }
        graph.insert(s.path.clone(), to);
    }
    graph
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> T<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut c = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    c.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if c.len() > 1 {
                    c.sort();
                    self.out.push(c);
                }
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// A parent module that uses its child and a child that uses its parent's items are one
/// unit (the child is the parent's part): only circles through files that are not each
/// other's ancestors count.
fn is_family(a: &str, b: &str) -> bool {
    let module = |p: &str| -> Vec<String> {
        let rel = p.split_once("/src/").map_or(p, |(_, r)| r);
        let mut m: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_string)
            .collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            m.pop();
        }
        m
    };
    let (ma, mb) = (module(a), module(b));
    ma.starts_with(&mb) || mb.starts_with(&ma)
}

#[test]
fn no_import_circle_between_the_files_of_a_crate() {
    let mut found = Vec::new();
    for (dir, _) in CRATES {
        let mut g = file_graph(dir);
        // Edges between a module and its own submodules are not circles of the code map.
        for (from, to) in g.iter_mut() {
            let from = from.clone();
            to.retain(|t| !is_family(&from, t));
        }
        found.extend(circles(&g));
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

/// The daemon's folders in ARCHITECTURE.md's order ("`config/` → `privilege/` → ..."): each
/// may import only the ones before it.
fn daemon_layers() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with('`') && l.contains(" → "))
        .expect("ARCHITECTURE.md names the daemon's layers as `a/` → `b/` → ...");
    line.split(" → ")
        .map(|s| {
            s.trim()
                .trim_end_matches('.')
                .trim_matches('`')
                .trim_end_matches('/')
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect()
}

#[test]
fn daemon_folders_import_only_the_ones_above_them() {
    let layers = daemon_layers();
    assert!(layers.len() >= 5, "{layers:?}");
    let layer_of = |path: &str| {
        let rel = path.strip_prefix("daemon/src/")?;
        let top = rel.split('/').next()?.trim_end_matches(".rs");
        layers.iter().position(|l| l == top)
    };
    let mut wrong = Vec::new();
    for (from, to) in file_graph("daemon") {
        let Some(lf) = layer_of(&from) else { continue };
        for t in to {
            if let Some(lt) = layer_of(&t)
                && lt > lf
            {
                wrong.push(format!("{from} -> {t}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers {layers:?} of ARCHITECTURE.md: {wrong:#?}"
    );
}

/// Files of a crate that name aya's maps or take them out of the loaded object.
struct MapUse(bool);

impl<'a> Visit<'a> for MapUse {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        let s: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.0 |= s.windows(2).any(|w| w[0] == "aya" && w[1] == "maps");
        syn::visit::visit_path(self, p);
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut out = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut out);
        self.0 |= out
            .iter()
            .any(|p| p.windows(2).any(|w| w[0] == "aya" && w[1] == "maps"));
    }
    fn visit_expr_method_call(&mut self, m: &'a syn::ExprMethodCall) {
        self.0 |= ["take_map", "map_mut"].contains(&m.method.to_string().as_str());
        syn::visit::visit_expr_method_call(self, m);
    }
}

/// ARCHITECTURE.md: "Only `pipeline/` ... and the commands that load programs of their own
/// (`commands/record/`, `commands/survey.rs`) touch BPF maps."
#[test]
fn only_the_pipeline_and_the_standalone_commands_touch_bpf_maps() {
    let allowed = [
        "daemon/src/pipeline/",
        "daemon/src/commands/record/",
        "daemon/src/commands/survey.rs",
    ];
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    assert!(
        doc.contains("Only `pipeline/` (the loader, the collector, the GPU probes and the on-demand samplers) and the commands that load programs of their own (`commands/record/`, `commands/survey.rs`) touch BPF maps"),
        "ARCHITECTURE.md states the invariant this test checks"
    );
    let mut touching = Vec::new();
    for s in sources("daemon") {
        let mut v = MapUse(false);
        v.visit_file(&s.ast);
        if v.0 {
            touching.push(s.path);
        }
    }
    let outside: Vec<&String> = touching
        .iter()
        .filter(|p| !allowed.iter().any(|a| p.starts_with(a)))
        .collect();
    assert!(
        outside.is_empty(),
        "BPF maps touched outside pipeline/ and the standalone commands: {outside:?}"
    );
    // The check sees what it must: the collector reads maps.
    assert!(
        touching
            .iter()
            .any(|p| p == "daemon/src/pipeline/collector.rs"),
        "{touching:?}"
    );
}

/// ARCHITECTURE.md's table of crates and the workspace crates each depends on, against the
/// crates' Cargo.toml files (read directly: the test runs as any user, without cargo).
#[test]
fn crate_dependencies_are_the_documented_ones() {
    let read = |p: PathBuf| -> toml::Table {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        text.parse()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let workspace = read(root().join("Cargo.toml"));
    let members: Vec<String> = workspace["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .filter_map(|m| m.as_str().map(str::to_string))
        .collect();
    let manifests: Vec<toml::Table> = members
        .iter()
        .map(|m| read(root().join(m).join("Cargo.toml")))
        .collect();
    let names: BTreeSet<String> = manifests
        .iter()
        .map(|m| {
            m["package"]["name"]
                .as_str()
                .expect("package.name")
                .to_string()
        })
        .collect();
    let mut actual: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in &manifests {
        let deps = m
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|d| {
                d.keys()
                    .filter(|k| names.contains(*k))
                    .cloned()
                    .collect::<BTreeSet<String>>()
            })
            .unwrap_or_default();
        actual.insert(
            m["package"]["name"].as_str().expect("name").to_string(),
            deps,
        );
    }
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let table = doc
        .split("| crate | depends on (workspace crates, normal dependencies) |")
        .nth(1)
        .expect("ARCHITECTURE.md has the crate dependency table");
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let deps = cells[2]
            .split(',')
            .map(|d| d.trim().trim_matches('`'))
            .filter(|d| !d.is_empty() && *d != "none")
            .map(str::to_string)
            .collect();
        documented.insert(cells[1].trim_matches('`').to_string(), deps);
    }
    assert_eq!(
        documented, actual,
        "ARCHITECTURE.md's crate table (left) is not what Cargo.toml files say (right)"
    );
}

/// Files that name the configuration's root type `Config` (a path segment or an import).
struct NamesConfig(bool);

impl<'a> Visit<'a> for NamesConfig {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_path_segment(&mut self, s: &'a syn::PathSegment) {
        self.0 |= s.ident == "Config";
        syn::visit::visit_path_segment(self, s);
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut out = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut out);
        self.0 |= out.iter().any(|p| p.iter().any(|s| s == "Config"));
    }
}

/// ARCHITECTURE.md: "`pipeline/`, `privilege/` and `serve/shared.rs` never name `Config`":
/// they read the resolved `Plan`.
#[test]
fn the_pipeline_privilege_and_shared_state_read_the_plan_not_the_config() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    assert!(
        doc.contains("`pipeline/`,\n`privilege/` and `serve/shared.rs` never name `Config`"),
        "ARCHITECTURE.md states the invariant this test checks"
    );
    let below = [
        "daemon/src/pipeline/",
        "daemon/src/privilege/",
        "daemon/src/serve/shared.rs",
    ];
    let mut naming = Vec::new();
    for s in sources("daemon") {
        let mut v = NamesConfig(false);
        v.visit_file(&s.ast);
        if v.0 {
            naming.push(s.path);
        }
    }
    let wrong: Vec<&String> = naming
        .iter()
        .filter(|p| below.iter().any(|b| p.starts_with(b)))
        .collect();
    assert!(
        wrong.is_empty(),
        "`Config` named below commands/ and serve/daemon.rs: {wrong:?}"
    );
    // The check sees what it must: start-up builds the plan from the configuration.
    assert!(
        naming.iter().any(|p| p == "daemon/src/serve/daemon.rs"),
        "{naming:?}"
    );
}
