//! [`GpuSource`]: one GPU as NVML describes it, the narrow view that
//! [`read_gpu`](super::read_gpu) reads; [`NvmlGpu`] implements it (and [`GpmSource`]) over
//! the loaded library.
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::struct_wrappers::device::{
    MemoryInfo, ProcessInfo, ProcessUtilizationSample, Utilization,
};
use nvml_wrapper::{Device, GpmSample, Nvml};

use super::{GPM_METRICS, GpmSource, GpmValues};

/// One GPU as NVML describes it, in NVML's units. Implemented over `nvml_wrapper::Device` by
/// the collector and by stand-ins in tests; each method is one NVML call.
pub trait GpuSource {
    /// `nvmlDeviceGetIndex`.
    fn index(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetUUID`.
    fn uuid(&self) -> Result<String, NvmlError>;
    /// `nvmlDeviceGetName`.
    fn name(&self) -> Result<String, NvmlError>;
    /// `nvmlDeviceGetPciInfo_v3`: `busId`.
    fn pci_bus_id(&self) -> Result<String, NvmlError>;
    /// `nvmlDeviceGetMinorNumber`.
    fn minor_number(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetUtilizationRates`: percent.
    fn utilization_rates(&self) -> Result<Utilization, NvmlError>;
    /// `nvmlDeviceGetMemoryInfo_v2`: bytes.
    fn memory_info(&self) -> Result<MemoryInfo, NvmlError>;
    /// `nvmlDeviceGetPowerUsage`: milliwatts.
    fn power_usage(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetTotalEnergyConsumption`: millijoules since the driver was loaded.
    fn total_energy_consumption(&self) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`: celsius.
    fn temperature(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetClockInfo`: MHz.
    fn clock_info(&self, clock: Clock) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetPcieThroughput`: KB/s.
    fn pcie_throughput(&self, counter: PcieUtilCounter) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetTotalEccErrors(type, NVML_VOLATILE_ECC)`.
    fn ecc_volatile(&self, error: MemoryError) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetCurrentClocksThrottleReasons`.
    fn throttle_reasons(&self) -> Result<ThrottleReasons, NvmlError>;
    /// `nvmlDeviceGetNvLinkState`.
    fn nvlink_active(&self, link: u32) -> Result<bool, NvmlError>;
    /// `nvmlDeviceGetFieldValues`: one call for all `fields`, each a (`fieldId`, `scopeId`)
    /// pair; a value per field, each on its own (unsigned, or signed and not negative).
    fn field_values(&self, fields: &[(u32, u32)])
    -> Result<Vec<Result<u64, NvmlError>>, NvmlError>;
    /// `nvmlDeviceGetNvLinkErrorCounter`.
    fn nvlink_error_counter(&self, link: u32, counter: ErrorCounter) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetEnforcedPowerLimit`: milliwatts.
    fn enforced_power_limit(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetEncoderUtilization`: percent.
    fn encoder_utilization(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetDecoderUtilization`: percent.
    fn decoder_utilization(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetCurrPcieLinkGeneration`.
    fn pcie_link_generation(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetMaxPcieLinkGeneration`.
    fn pcie_link_generation_max(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetCurrPcieLinkWidth`: lanes.
    fn pcie_link_width(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetMaxPcieLinkWidth`: lanes.
    fn pcie_link_width_max(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetComputeRunningProcesses_v3`.
    fn compute_processes(&self) -> Result<Vec<ProcessInfo>, NvmlError>;
    /// `nvmlDeviceGetProcessUtilization`: samples newer than `since` (µs; None: all the
    /// driver buffered).
    fn process_utilization(
        &self,
        since: Option<u64>,
    ) -> Result<Vec<ProcessUtilizationSample>, NvmlError>;
}

/// [`GpuSource`] over the real library.
pub(super) struct NvmlGpu<'a> {
    pub(super) nvml: &'a Nvml,
    pub(super) device: Device<'a>,
}

impl GpuSource for NvmlGpu<'_> {
    fn index(&self) -> Result<u32, NvmlError> {
        self.device.index()
    }
    fn uuid(&self) -> Result<String, NvmlError> {
        self.device.uuid()
    }
    fn name(&self) -> Result<String, NvmlError> {
        self.device.name()
    }
    fn pci_bus_id(&self) -> Result<String, NvmlError> {
        self.device.pci_info().map(|p| p.bus_id)
    }
    fn minor_number(&self) -> Result<u32, NvmlError> {
        self.device.minor_number()
    }
    fn utilization_rates(&self) -> Result<Utilization, NvmlError> {
        self.device.utilization_rates()
    }
    fn memory_info(&self) -> Result<MemoryInfo, NvmlError> {
        self.device.memory_info()
    }
    fn power_usage(&self) -> Result<u32, NvmlError> {
        self.device.power_usage()
    }
    fn total_energy_consumption(&self) -> Result<u64, NvmlError> {
        self.device.total_energy_consumption()
    }
    fn temperature(&self) -> Result<u32, NvmlError> {
        self.device.temperature(TemperatureSensor::Gpu)
    }
    fn clock_info(&self, clock: Clock) -> Result<u32, NvmlError> {
        self.device.clock_info(clock)
    }
    fn pcie_throughput(&self, counter: PcieUtilCounter) -> Result<u32, NvmlError> {
        self.device.pcie_throughput(counter)
    }
    fn ecc_volatile(&self, error: MemoryError) -> Result<u64, NvmlError> {
        self.device.total_ecc_errors(error, EccCounter::Volatile)
    }
    fn throttle_reasons(&self) -> Result<ThrottleReasons, NvmlError> {
        self.device.current_throttle_reasons()
    }
    fn nvlink_active(&self, link: u32) -> Result<bool, NvmlError> {
        self.device.link_wrapper_for(link).is_active()
    }
    fn field_values(
        &self,
        fields: &[(u32, u32)],
    ) -> Result<Vec<Result<u64, NvmlError>>, NvmlError> {
        use nvml_wrapper_sys::bindings::{
            nvmlFieldValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT as SINT,
            nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG as SLONGLONG,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT as UINT,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG as ULONG,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as ULONGLONG,
        };
        // nvml-wrapper's field_values_for() cannot set scopeId (the NVLink), so call
        // nvmlDeviceGetFieldValues through the bindings it loaded. The one raw NVML call.
        let get = self
            .nvml
            .lib()
            .nvmlDeviceGetFieldValues
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let count = i32::try_from(fields.len()).map_err(|_| NvmlError::InvalidArg)?;
        let mut values: Vec<nvmlFieldValue_t> = fields
            .iter()
            .map(|&(id, scope)| {
                // SAFETY: nvmlFieldValue_t is plain C data; all zeroes is a valid value.
                let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                v.fieldId = id;
                v.scopeId = scope;
                v
            })
            .collect();
        // SAFETY: the handle is valid while `self.device` lives (it borrows the Nvml that
        // loaded the library) and `values` holds the `count` entries NVML fills.
        nvml_try(unsafe { get(self.device.handle(), count, values.as_mut_ptr()) })?;
        let read = |v: &nvmlFieldValue_t| {
            nvml_try(v.nvmlReturn)?;
            // SAFETY: `valueType` names the union member NVML wrote.
            let signed = unsafe {
                match v.valueType {
                    ULONGLONG => return Ok(v.value.ullVal),
                    // c_ulong is 32 bits on some targets.
                    #[allow(clippy::useless_conversion)]
                    ULONG => return Ok(u64::from(v.value.ulVal)),
                    UINT => return Ok(u64::from(v.value.uiVal)),
                    SLONGLONG => v.value.sllVal,
                    SINT => i64::from(v.value.siVal),
                    other => return Err(NvmlError::UnexpectedVariant(other)),
                }
            };
            // A count or a temperature below zero is not one: the driver's placeholder.
            u64::try_from(signed).map_err(|_| NvmlError::UnexpectedVariant(v.valueType))
        };
        Ok(values.iter().map(read).collect())
    }
    fn enforced_power_limit(&self) -> Result<u32, NvmlError> {
        self.device.enforced_power_limit()
    }
    fn encoder_utilization(&self) -> Result<u32, NvmlError> {
        self.device.encoder_utilization().map(|u| u.utilization)
    }
    fn decoder_utilization(&self) -> Result<u32, NvmlError> {
        self.device.decoder_utilization().map(|u| u.utilization)
    }
    fn pcie_link_generation(&self) -> Result<u32, NvmlError> {
        self.device.current_pcie_link_gen()
    }
    fn pcie_link_generation_max(&self) -> Result<u32, NvmlError> {
        self.device.max_pcie_link_gen()
    }
    fn pcie_link_width(&self) -> Result<u32, NvmlError> {
        self.device.current_pcie_link_width()
    }
    fn pcie_link_width_max(&self) -> Result<u32, NvmlError> {
        self.device.max_pcie_link_width()
    }
    fn nvlink_error_counter(&self, link: u32, counter: ErrorCounter) -> Result<u64, NvmlError> {
        self.device.link_wrapper_for(link).error_counter(counter)
    }
    fn compute_processes(&self) -> Result<Vec<ProcessInfo>, NvmlError> {
        self.device.running_compute_processes()
    }
    fn process_utilization(
        &self,
        since: Option<u64>,
    ) -> Result<Vec<ProcessUtilizationSample>, NvmlError> {
        self.device.process_utilization_stats(since)
    }
}

impl<'a> GpmSource for NvmlGpu<'a> {
    type Sample = GpmSample<'a>;
    fn gpm_supported(&self) -> Result<bool, NvmlError> {
        self.device.gpm_support()
    }
    fn gpm_sample(&self) -> Result<GpmSample<'a>, NvmlError> {
        self.device.gpm_sample()
    }
    fn gpm_metrics(
        &self,
        earlier: &GpmSample<'a>,
        later: &GpmSample<'a>,
    ) -> Result<GpmValues, NvmlError> {
        let mut values =
            nvml_wrapper::gpm::gpm_metrics_get(self.nvml, earlier, later, &GPM_METRICS)?
                .into_iter()
                .map(|r| r.map(|m| m.value));
        Ok(std::array::from_fn(|_| {
            values
                .next()
                .unwrap_or(Err(NvmlError::UnexpectedVariant(0)))
        }))
    }
}
