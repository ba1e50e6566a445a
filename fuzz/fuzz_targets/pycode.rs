//! Code objects read from another user's process memory (`ethand_reader::pycode`): the fuzz
//! bytes are the whole of that memory, mapped at a fixed address; any layout, any object
//! address. A code object or an error, never a panic, and never a read (or an allocation)
//! beyond the reader's bounds.
#![no_main]
use ethand_common::PY_LAYOUTS;
use ethand_reader::pycode::{Memory, PyTypes, read_code};
use libfuzzer_sys::fuzz_target;

const BASE: u64 = 0x1000_0000;

struct Bytes<'a>(&'a [u8]);

impl Memory for Bytes<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        // The reader bounds every read before it allocates: a read of more than a line
        // table's bound (1 MiB) would be a bug.
        assert!(buf.len() <= ethand_reader::pycode::MAX_LINE_TABLE + 64);
        let start = addr
            .checked_sub(BASE)
            .and_then(|o| usize::try_from(o).ok())
            .filter(|o| o.checked_add(buf.len()).is_some_and(|end| end <= self.0.len()))
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc_efault()))?;
        buf.copy_from_slice(&self.0[start..start + buf.len()]);
        Ok(())
    }
}

fn libc_efault() -> i32 {
    14
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let layout = &PY_LAYOUTS[data[0] as usize % PY_LAYOUTS.len()];
    let at = BASE + u64::from(u16::from_le_bytes([data[1], data[2]]));
    // Half the runs check the objects' types against addresses inside the memory.
    let types = if data[3] & 1 == 1 {
        PyTypes {
            code: Some(BASE),
            str: Some(BASE + 8),
            bytes: Some(BASE + 16),
        }
    } else {
        PyTypes::default()
    };
    if let Ok(code) = read_code(&Bytes(data), layout, &types, at) {
        let _ = code.line(layout.minor, u32::from(data[3]));
    }
});
