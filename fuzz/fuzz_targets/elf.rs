//! The uprobe symbol resolver over arbitrary bytes as an ELF file (a library found in a
//! container's /proc/PID/maps is not trusted).
#![no_main]
use ethand_userspace_probes::elf::SymbolTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(table) = SymbolTable::parse(data) else {
        return;
    };
    // Names are distinct; the table may hold one name twice (versions, aliases).
    let names = table.names_with_prefix("");
    assert!(names.len() <= table.len());
    let mut wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    wanted.extend(["cuLaunchKernel", "ncclAllReduce", "missing"]);
    let resolved = table.resolve(wanted.iter().copied());
    assert_eq!(resolved.len(), wanted.len());
});
