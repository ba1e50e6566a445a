//! Huawei Ascend NPUs through DCMI (`libdcmi.so`, the NPU driver's management library),
//! loaded at run time with `libloading`.
//!
//! **Not yet run against real Ascend hardware**: it is tested against a stand-in library
//! (`tests/standins/dcmi.c`) built from the same documented prototypes.
//!
//! Prototypes and struct layouts come from Huawei's public DCMI API reference ("DCMI API
//! Reference", hiascend.com: `dcmi_get_device_hbm_info`, `dcmi_get_device_power_info`
//! (unit 0.1 W), `dcmi_get_device_health` (0 normal .. 3 critical, 0xFFFFFFFF no device),
//! `dcmi_get_device_resource_info` (at most 32 processes, memory in bytes)...) and the
//! `dcmi_interface_api.h` that Huawei ships in its open-source Ascend tools (for example
//! Ascend/ascend-docker-runtime), which also gives the error codes (`DCMI_ERR_CODE_*`).
//!
//! Only `dcmi_init`, the card list (`dcmi_get_card_num_list`, or `dcmi_get_card_list` in
//! newer libraries) and `dcmi_get_device_num_in_card` are required; every other symbol is
//! looked up on its own and, when the library lacks it, its field stays `None` (the status
//! detail lists what is missing). A call returning `DCMI_ERR_CODE_NOT_SUPPORT` leaves its
//! field `None` silently; other errors also add a note.
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_ulonglong};
use std::path::Path;

use libloading::Library;

use super::{CollectorState, DeviceCollector, DeviceError, DeviceProcess, DeviceSample, NpuDevice};

/// The collector's name in statuses and labels.
pub const NAME: &str = "dcmi";
/// Where `libdcmi.so` is looked for, in order, unless configured: the dynamic linker's search
/// path, then the Ascend driver's and the DCMI package's install directories.
pub const DEFAULT_LIBRARIES: &[&str] = &[
    "libdcmi.so",
    "/usr/local/Ascend/driver/lib64/driver/libdcmi.so",
    "/usr/local/dcmi/libdcmi.so",
];

/// `input_type` of `dcmi_get_device_utilization_rate` for the AI cores
/// (`DCMI_UTILIZATION_RATE_AICORE`).
const UTILIZATION_AICORE: c_int = 2;
/// `enum dcmi_die_type`: `VDIE`.
const DIE_TYPE_VDIE: c_int = 1;
/// `MAX_CARD_NUM`.
const MAX_CARDS: usize = 64;
/// `dcmi_get_device_resource_info` writes at most 32 entries (documented); room for more.
const MAX_PROCESSES: usize = 64;
/// `dcmi_get_device_health` for a chip that does not exist.
const HEALTH_NO_DEVICE: c_uint = 0xFFFF_FFFF;

/// `DCMI_ERR_CODE_NOT_SUPPORT`: the chip or library does not do this.
pub const ERR_NOT_SUPPORT: c_int = -8255;

/// What a DCMI return code means (`DCMI_ERR_CODE_*` of `dcmi_interface_api.h`).
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "ok",
        -8001 => "invalid parameter",
        -8002 => "operation not permitted",
        -8003 => "memory operation failed",
        -8004 => "secure function failed",
        -8005 => "inner error",
        -8006 => "timed out",
        -8007 => "invalid device id",
        -8008 => "device does not exist",
        -8009 => "ioctl failed",
        -8010 => "send message failed",
        -8011 => "receive message failed",
        -8012 => "not ready",
        -8013 => "not supported in a container",
        -8014 => "file operation failed",
        -8015 => "reset failed",
        -8016 => "operation aborted",
        -8017 => "upgrading",
        -8020 => "resource occupied",
        -8022 => "partition not right",
        ERR_NOT_SUPPORT => "not supported",
        _ => "unknown error",
    }
}

// The C structs, laid out as `dcmi_interface_api.h` declares them (sizes pinned by a test).

/// `struct dcmi_hbm_info`: sizes in MB (MiB), frequency in MHz, rate in percent.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct HbmInfo {
    memory_size: c_ulonglong,
    freq: c_uint,
    memory_usage: c_ulonglong,
    temp: c_int,
    bandwith_util_rate: c_uint,
}

/// `struct dcmi_chip_info`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChipInfo {
    chip_type: [u8; 32],
    chip_name: [u8; 32],
    chip_ver: [u8; 32],
    aicore_cnt: c_uint,
}

/// `struct dcmi_pcie_info` (`dcmi_get_device_pcie_info`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PcieInfo {
    deviceid: c_uint,
    venderid: c_uint,
    subvenderid: c_uint,
    subdeviceid: c_uint,
    bdf_deviceid: c_uint,
    bdf_busid: c_uint,
    bdf_funcid: c_uint,
}

/// `struct dcmi_pcie_info_all` (`dcmi_get_device_pcie_info_v2`), 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PcieInfoAll {
    venderid: c_uint,
    subvenderid: c_uint,
    deviceid: c_uint,
    subdeviceid: c_uint,
    domain: c_int,
    bdf_busid: c_uint,
    bdf_deviceid: c_uint,
    bdf_funcid: c_uint,
    reserve: [u8; 32],
}

/// `struct dcmi_die_id`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DieId {
    soc_die: [c_uint; 5],
}

/// `struct dcmi_proc_mem_info`: host pid and bytes (device OS plus allocations).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcMemInfo {
    proc_id: c_int,
    proc_mem_usage: c_ulong,
}

type FnInit = unsafe extern "C" fn() -> c_int;
type FnCardList = unsafe extern "C" fn(*mut c_int, *mut c_int, c_int) -> c_int;
type FnDeviceNum = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
type FnUtilization = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_uint) -> c_int;
type FnHbm = unsafe extern "C" fn(c_int, c_int, *mut HbmInfo) -> c_int;
type FnInt = unsafe extern "C" fn(c_int, c_int, *mut c_int) -> c_int;
type FnUint = unsafe extern "C" fn(c_int, c_int, *mut c_uint) -> c_int;
type FnLogicId = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type FnChipInfo = unsafe extern "C" fn(c_int, c_int, *mut ChipInfo) -> c_int;
type FnPcie = unsafe extern "C" fn(c_int, c_int, *mut PcieInfo) -> c_int;
type FnPcieAll = unsafe extern "C" fn(c_int, c_int, *mut PcieInfoAll) -> c_int;
type FnDie = unsafe extern "C" fn(c_int, c_int, c_int, *mut DieId) -> c_int;
type FnResources = unsafe extern "C" fn(c_int, c_int, *mut ProcMemInfo, *mut c_int) -> c_int;
type FnVersion = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;

/// The library's entry points. Function pointers stay valid while the `Library` they came
/// from is loaded: [`DcmiCollector`] keeps both and drops the library last.
struct Api {
    init: FnInit,
    card_list: FnCardList,
    card_list_name: &'static str,
    device_num: FnDeviceNum,
    utilization: Option<FnUtilization>,
    hbm: Option<FnHbm>,
    power: Option<FnInt>,
    temperature: Option<FnInt>,
    health: Option<FnUint>,
    logic_id: Option<FnLogicId>,
    chip_info: Option<FnChipInfo>,
    pcie_all: Option<FnPcieAll>,
    pcie: Option<FnPcie>,
    die: Option<FnDie>,
    resources: Option<FnResources>,
    driver_version: Option<FnVersion>,
    /// Optional symbols the library lacks.
    missing: Vec<&'static str>,
}

impl Api {
    /// Looks up every symbol; Err names a required one that is missing.
    fn resolve(lib: &Library) -> Result<Self, &'static str> {
        let mut missing = Vec::new();
        let m = &mut missing;
        // SAFETY (every lookup here and below): the types are the documented C prototypes.
        let utilization = unsafe { optional(lib, m, "dcmi_get_device_utilization_rate") };
        let hbm = unsafe { optional(lib, m, "dcmi_get_device_hbm_info") };
        let power = unsafe { optional(lib, m, "dcmi_get_device_power_info") };
        let temperature = unsafe { optional(lib, m, "dcmi_get_device_temperature") };
        let health = unsafe { optional(lib, m, "dcmi_get_device_health") };
        let logic_id = unsafe { optional(lib, m, "dcmi_get_device_logic_id") };
        let chip_info = unsafe { optional(lib, m, "dcmi_get_device_chip_info") };
        let resources = unsafe { optional(lib, m, "dcmi_get_device_resource_info") };
        let driver_version = unsafe { optional(lib, m, "dcmi_get_driver_version") };
        let die = unsafe { optional(lib, m, "dcmi_get_device_die_v2") };
        let pcie_all = unsafe { symbol(lib, "dcmi_get_device_pcie_info_v2") };
        let pcie = unsafe { symbol(lib, "dcmi_get_device_pcie_info") };
        if pcie_all.is_none() && pcie.is_none() {
            missing.push("dcmi_get_device_pcie_info_v2");
        }
        let (card_list, card_list_name) =
            match unsafe { symbol::<FnCardList>(lib, "dcmi_get_card_num_list") } {
                Some(f) => (f, "dcmi_get_card_num_list"),
                None => (
                    unsafe { symbol(lib, "dcmi_get_card_list") }.ok_or("dcmi_get_card_num_list")?,
                    "dcmi_get_card_list",
                ),
            };
        Ok(Self {
            init: unsafe { symbol(lib, "dcmi_init") }.ok_or("dcmi_init")?,
            card_list,
            card_list_name,
            device_num: unsafe { symbol(lib, "dcmi_get_device_num_in_card") }
                .ok_or("dcmi_get_device_num_in_card")?,
            utilization,
            hbm,
            power,
            temperature,
            health,
            logic_id,
            chip_info,
            pcie_all,
            pcie,
            die,
            resources,
            driver_version,
            missing,
        })
    }
}

/// [`symbol`], recording a missing one in `missing`.
///
/// # Safety
/// As for [`symbol`].
unsafe fn optional<T: Copy>(
    lib: &Library,
    missing: &mut Vec<&'static str>,
    name: &'static str,
) -> Option<T> {
    // SAFETY: the caller vouches for the type.
    let f = unsafe { symbol(lib, name) };
    if f.is_none() {
        missing.push(name);
    }
    f
}

/// # Safety
/// `T` must be the function pointer type of the symbol's C prototype.
unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    // SAFETY: the caller vouches for the type; the pointer is used only while `lib` lives.
    unsafe { lib.get::<T>(name.as_bytes()).ok().map(|s| *s) }
}

/// One NPU chip: where DCMI finds it, and its identity (read once, at open).
struct Chip {
    card: c_int,
    device: c_int,
    identity: NpuDevice,
}

/// Reads every Ascend NPU chip through DCMI. Chips are enumerated once, when opened.
pub struct DcmiCollector {
    api: Api,
    chips: Vec<Chip>,
    detail: String,
    /// Declared last so it is unloaded after everything that points into it.
    _lib: Library,
}

impl DcmiCollector {
    /// Loads `libdcmi.so` (`library`, or the first of [`DEFAULT_LIBRARIES`] that loads),
    /// initialises DCMI and lists the chips. Err: the state to report (unavailable: no
    /// library or no chip; failed: the library is unusable or `dcmi_init` failed) and why.
    pub(crate) fn open(library: Option<&Path>) -> Result<Self, (CollectorState, String)> {
        let (lib, shown) = load(library)?;
        let api = Api::resolve(&lib).map_err(|missing| {
            (
                CollectorState::Failed,
                format!("{shown} lacks {missing}: not a usable DCMI library"),
            )
        })?;
        // SAFETY: documented prototype, no arguments.
        let rc = unsafe { (api.init)() };
        if rc != 0 {
            return Err((
                CollectorState::Failed,
                format!("dcmi_init returned {rc} ({})", code_name(rc)),
            ));
        }
        let mut cards = [0 as c_int; MAX_CARDS];
        let mut n: c_int = 0;
        // SAFETY: `cards` holds the MAX_CARDS entries the length says.
        let rc = unsafe { (api.card_list)(&mut n, cards.as_mut_ptr(), MAX_CARDS as c_int) };
        if rc != 0 {
            return Err((
                CollectorState::Failed,
                format!("{} returned {rc} ({})", api.card_list_name, code_name(rc)),
            ));
        }
        let mut problems = Vec::new();
        let mut chips = Vec::new();
        for &card in &cards[..(n.clamp(0, MAX_CARDS as c_int) as usize)] {
            let mut devices: c_int = 0;
            // SAFETY: documented prototype; one int out.
            let rc = unsafe { (api.device_num)(card, &mut devices) };
            if rc != 0 {
                problems.push(format!(
                    "card {card}: dcmi_get_device_num_in_card returned {rc} ({})",
                    code_name(rc)
                ));
                continue;
            }
            for device in 0..devices.max(0) {
                let index = chips.len() as u32;
                chips.push(Chip {
                    card,
                    device,
                    identity: identity(&api, card, device, index),
                });
            }
        }
        if chips.is_empty() {
            let mut why = "DCMI reports no NPU chip".to_owned();
            if !problems.is_empty() {
                why = format!("{why}: {}", problems.join("; "));
            }
            return Err((CollectorState::Unavailable, why));
        }
        if !api.missing.is_empty() {
            problems.push(format!(
                "{shown} lacks {}: those fields are not reported",
                api.missing.join(", ")
            ));
        }
        Ok(Self {
            api,
            chips,
            detail: problems.join("; "),
            _lib: lib,
        })
    }

    /// What the status should say about an available collector.
    pub(crate) fn detail(&self) -> String {
        self.detail.clone()
    }
}

fn load(library: Option<&Path>) -> Result<(Library, String), (CollectorState, String)> {
    let candidates: Vec<&std::ffi::OsStr> = match library {
        Some(p) => vec![p.as_os_str()],
        None => DEFAULT_LIBRARIES.iter().map(std::ffi::OsStr::new).collect(),
    };
    let mut errors = Vec::new();
    for c in &candidates {
        // SAFETY: loading runs the library's initialisers; libdcmi.so is the NPU driver's
        // own management library, the one its tools (npu-smi, npu-exporter) load.
        match unsafe { Library::new(c) } {
            Ok(lib) => return Ok((lib, c.to_string_lossy().into_owned())),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let name = candidates[0].to_string_lossy();
    Err((
        CollectorState::Unavailable,
        format!("{name} not found: no Ascend driver ({})", errors.join("; ")),
    ))
}

/// The chip's identity; what the library lacks or refuses stays empty.
fn identity(api: &Api, card: c_int, device: c_int, enumerated: u32) -> NpuDevice {
    let mut npu = NpuDevice {
        index: enumerated,
        card_id: card,
        device_id: device,
        ..Default::default()
    };
    // SAFETY (every call below): documented prototypes, each out-parameter a valid struct
    // or buffer of the declared size.
    if let Some(f) = api.logic_id {
        let mut id: c_int = 0;
        if unsafe { f(&mut id, card, device) } == 0 && id >= 0 {
            npu.index = id as u32;
        }
    }
    if let Some(f) = api.chip_info {
        let mut chip = ChipInfo {
            chip_type: [0; 32],
            chip_name: [0; 32],
            chip_ver: [0; 32],
            aicore_cnt: 0,
        };
        if unsafe { f(card, device, &mut chip) } == 0 {
            npu.name = format!("{}{}", c_str(&chip.chip_type), c_str(&chip.chip_name));
        }
    }
    let mut pcie_all = PcieInfoAll::default();
    let mut pcie = PcieInfo::default();
    if let Some(f) = api.pcie_all
        && unsafe { f(card, device, &mut pcie_all) } == 0
    {
        npu.pci_bus_id = bdf(
            pcie_all.domain as u32,
            pcie_all.bdf_busid,
            pcie_all.bdf_deviceid,
            pcie_all.bdf_funcid,
        );
    } else if let Some(f) = api.pcie
        && unsafe { f(card, device, &mut pcie) } == 0
    {
        npu.pci_bus_id = bdf(0, pcie.bdf_busid, pcie.bdf_deviceid, pcie.bdf_funcid);
    }
    if let Some(f) = api.die {
        let mut die = DieId::default();
        if unsafe { f(card, device, DIE_TYPE_VDIE, &mut die) } == 0 {
            npu.uuid = die
                .soc_die
                .iter()
                .map(|w| format!("{w:08X}"))
                .collect::<Vec<_>>()
                .join("-");
        }
    }
    if let Some(f) = api.driver_version {
        let mut buf = [0u8; 256];
        if unsafe { f(buf.as_mut_ptr().cast(), buf.len() as c_uint) } == 0 {
            npu.driver_version = c_str(&buf);
        }
    }
    npu
}

fn bdf(domain: u32, bus: u32, device: u32, function: u32) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
}

/// A NUL-terminated (or full) C char array as text.
fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_owned()
}

/// Turns DCMI return codes into fields and notes, and remembers whether anything worked.
struct Calls<'a> {
    notes: &'a mut Vec<String>,
    succeeded: bool,
    first_error: Option<(&'static str, c_int)>,
}

impl Calls<'_> {
    /// Some(()) when `rc` is 0; None otherwise, noting errors other than "not supported".
    fn check(&mut self, label: &str, call: &'static str, rc: c_int) -> Option<()> {
        match rc {
            0 => {
                self.succeeded = true;
                Some(())
            }
            ERR_NOT_SUPPORT => None,
            rc => {
                self.notes
                    .push(format!("{label}: {call} returned {rc} ({})", code_name(rc)));
                self.first_error.get_or_insert((call, rc));
                None
            }
        }
    }
}

impl DeviceCollector for DcmiCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn collect(&mut self) -> Result<DeviceSample, DeviceError> {
        const MIB: u64 = 1 << 20;
        let mut sample = DeviceSample::default();
        let mut calls = Calls {
            notes: &mut sample.notes,
            succeeded: false,
            first_error: None,
        };
        let api = &self.api;
        // SAFETY (every call below): documented prototypes, each out-parameter a valid value
        // or buffer of the size the call expects.
        for chip in &self.chips {
            let (card, dev) = (chip.card, chip.device);
            let mut npu = chip.identity.clone();
            let label = npu.label();

            if let Some(f) = api.utilization {
                let mut rate: c_uint = 0;
                let rc = unsafe { f(card, dev, UTILIZATION_AICORE, &mut rate) };
                if calls
                    .check(&label, "dcmi_get_device_utilization_rate", rc)
                    .is_some()
                {
                    npu.aicore_utilization_ratio = Some(f64::from(rate) / 100.0);
                }
            }
            if let Some(f) = api.hbm {
                let mut hbm = HbmInfo::default();
                let rc = unsafe { f(card, dev, &mut hbm) };
                if calls
                    .check(&label, "dcmi_get_device_hbm_info", rc)
                    .is_some()
                {
                    npu.hbm_total_bytes = Some(hbm.memory_size.saturating_mul(MIB));
                    npu.hbm_used_bytes = Some(hbm.memory_usage.saturating_mul(MIB));
                    npu.hbm_temperature_celsius = Some(i64::from(hbm.temp));
                    npu.hbm_bandwidth_utilization_ratio =
                        Some(f64::from(hbm.bandwith_util_rate) / 100.0);
                }
            }
            if let Some(f) = api.power {
                let mut decawatts: c_int = 0;
                let rc = unsafe { f(card, dev, &mut decawatts) };
                if calls
                    .check(&label, "dcmi_get_device_power_info", rc)
                    .is_some()
                {
                    npu.power_watts = Some(f64::from(decawatts) / 10.0);
                }
            }
            if let Some(f) = api.temperature {
                let mut celsius: c_int = 0;
                let rc = unsafe { f(card, dev, &mut celsius) };
                if calls
                    .check(&label, "dcmi_get_device_temperature", rc)
                    .is_some()
                {
                    npu.temperature_celsius = Some(i64::from(celsius));
                }
            }
            if let Some(f) = api.health {
                let mut health: c_uint = 0;
                let rc = unsafe { f(card, dev, &mut health) };
                if calls.check(&label, "dcmi_get_device_health", rc).is_some() {
                    if health == HEALTH_NO_DEVICE {
                        calls
                            .notes
                            .push(format!("{label}: dcmi_get_device_health: no such device"));
                    } else {
                        npu.health = Some(health);
                    }
                }
            }
            if let Some(f) = api.resources {
                let mut procs = [ProcMemInfo::default(); MAX_PROCESSES];
                let mut n: c_int = 0;
                let rc = unsafe { f(card, dev, procs.as_mut_ptr(), &mut n) };
                if calls
                    .check(&label, "dcmi_get_device_resource_info", rc)
                    .is_some()
                {
                    let n = n.clamp(0, MAX_PROCESSES as c_int) as usize;
                    sample
                        .processes
                        .extend(procs[..n].iter().filter(|p| p.proc_id > 0).map(|p| {
                            DeviceProcess {
                                pid: p.proc_id as u32,
                                device: label.clone(),
                                uuid: npu.uuid.clone(),
                                memory_used_bytes: Some(p.proc_mem_usage),
                                utilization_ratio: None,
                            }
                        }));
                }
            }
            sample.npus.push(npu);
        }
        // Every call of every chip failed: the collector as a whole is not working.
        if !calls.succeeded
            && let Some((call, code)) = calls.first_error
        {
            return Err(DeviceError::Dcmi { call, code });
        }
        Ok(sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_the_header() {
        use std::mem::size_of;
        assert_eq!(size_of::<HbmInfo>(), 32);
        assert_eq!(size_of::<ChipInfo>(), 100);
        assert_eq!(size_of::<PcieInfo>(), 28);
        // "the size of dcmi_pcie_info_all is 64"
        assert_eq!(size_of::<PcieInfoAll>(), 64);
        assert_eq!(size_of::<DieId>(), 20);
        assert_eq!(size_of::<ProcMemInfo>(), 16);
    }

    #[test]
    fn helpers() {
        assert_eq!(bdf(0, 0xc1, 0, 0), "0000:c1:00.0");
        assert_eq!(c_str(b"910B3\0\0garbage"), "910B3");
        assert_eq!(c_str(b"full"), "full");
        assert_eq!(code_name(-8255), "not supported");
        assert_eq!(code_name(-1), "unknown error");
    }

    #[test]
    fn missing_library_is_unavailable() {
        let Err((state, detail)) = DcmiCollector::open(Some(Path::new("/nonexistent/libdcmi.so")))
        else {
            panic!("opened a library that does not exist");
        };
        assert_eq!(state, CollectorState::Unavailable);
        assert!(
            detail.starts_with("/nonexistent/libdcmi.so not found: no Ascend driver ("),
            "{detail}"
        );
    }
}
