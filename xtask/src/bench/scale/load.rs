//! The load generator: long-lived processes and threads doing a little work every second, and
//! process births, forked from this process and killed as a process group when dropped.
use super::*;

/// The comm of every load process (births exec /bin/true and are `true`).
pub const LOAD_COMM: &str = "ethand-load";
pub(super) const MAX_PROCESSES: usize = 4096;

/// What the load generator runs.
#[derive(Clone, Copy, Debug)]
pub struct LoadSpec {
    /// Long-lived processes.
    pub processes: usize,
    /// Every `threads_every`-th process has `extra_threads` more threads.
    pub threads_every: usize,
    pub extra_threads: usize,
    /// Short-lived processes started per second (fork + exec of /bin/true).
    pub births_per_s: u32,
}

impl LoadSpec {
    pub const FULL: LoadSpec = LoadSpec {
        processes: 1000,
        threads_every: 10,
        extra_threads: 3,
        births_per_s: 100,
    };

    pub fn threads(&self) -> usize {
        self.processes + self.processes.div_ceil(self.threads_every) * self.extra_threads
    }

    pub fn describe(&self) -> String {
        format!(
            "{} long-lived processes (comm `{LOAD_COMM}`; every {}th with {} threads, {} threads \
             in all), each thread waking once a second (phases spread over the second) to make \
             4 syscalls (openat, write of 64 bytes to /dev/null, close, getppid) and spin about \
             20 µs, then nanosleep; plus {} process births per second (fork + exec of \
             /bin/true, reaped at once)",
            self.processes,
            self.threads_every,
            self.extra_threads + 1,
            self.threads(),
            self.births_per_s
        )
    }
}

/// Shared between the bench and its load (an anonymous shared mapping made before the fork).
#[repr(C)]
pub(super) struct Shared {
    ready: AtomicU64,
    births: AtomicU64,
    failed_births: AtomicU64,
    pids: [AtomicI32; MAX_PROCESSES],
}

/// The running load: a leader process (its own process group) with the long-lived processes
/// as its children, which also forks the births. Everything is SIGKILLed when dropped (and
/// dies with the bench: PR_SET_PDEATHSIG).
pub struct Load {
    leader: libc::pid_t,
    shared: *mut Shared,
}

impl Load {
    /// Forks the load and waits until every long-lived process runs. Call it while this
    /// process has no other threads (the children only make system calls and start threads,
    /// but a lock held by another thread at the fork would stay held in them).
    pub fn start(spec: LoadSpec) -> Result<Load> {
        ensure!(
            spec.processes <= MAX_PROCESSES,
            "at most {MAX_PROCESSES} processes"
        );
        raise_nproc();
        let size = std::mem::size_of::<Shared>();
        // SAFETY: a fresh anonymous shared mapping, zeroed by the kernel (valid atomics).
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        ensure!(
            shared != libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let shared = shared as *mut Shared;
        let true_bin = CString::new("/bin/true").expect("no NUL");
        let parent = unsafe { libc::getpid() };
        // SAFETY: see the doc comment; the child never returns.
        let leader = unsafe { libc::fork() };
        if leader < 0 {
            let e = std::io::Error::last_os_error();
            unsafe { libc::munmap(shared as *mut _, size) };
            bail!("fork: {e}");
        }
        if leader == 0 {
            unsafe { run_leader(spec, &*shared, parent, &true_bin) }
        }
        unsafe { libc::setpgid(leader, leader) };
        let load = Load { leader, shared };
        let deadline = Instant::now() + Duration::from_secs(60);
        while (load.shared().ready.load(Ordering::Relaxed) as usize) < spec.processes {
            let mut status = 0;
            if unsafe { libc::waitpid(leader, &mut status, libc::WNOHANG) } == leader {
                bail!("the load's leader exited (wait status {status}) while starting");
            }
            ensure!(
                Instant::now() < deadline,
                "only {} of {} load processes started within 60 s",
                load.shared().ready.load(Ordering::Relaxed),
                spec.processes
            );
            sleep(Duration::from_millis(50));
        }
        Ok(load)
    }

    fn shared(&self) -> &Shared {
        // SAFETY: mapped until drop.
        unsafe { &*self.shared }
    }

    /// Pid of the leader: every load process descends from it.
    pub fn leader(&self) -> u32 {
        self.leader as u32
    }

    /// Pid of the i-th long-lived process.
    pub fn pid(&self, i: usize) -> u32 {
        self.shared().pids[i].load(Ordering::Relaxed) as u32
    }

    /// (births so far, failed forks so far).
    pub fn births(&self) -> (u64, u64) {
        let s = self.shared();
        (
            s.births.load(Ordering::Relaxed),
            s.failed_births.load(Ordering::Relaxed),
        )
    }

    /// Fails if the leader is gone.
    pub fn ensure_running(&self) -> Result<()> {
        let mut status = 0;
        let r = unsafe { libc::waitpid(self.leader, &mut status, libc::WNOHANG) };
        ensure!(r == 0, "the load's leader exited (wait status {status})");
        Ok(())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        unsafe {
            libc::kill(-self.leader, libc::SIGKILL);
            libc::kill(self.leader, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.leader, &mut status, 0);
            libc::munmap(self.shared as *mut _, std::mem::size_of::<Shared>());
        }
    }
}

/// `cargo xtask scale-load`: the scale suite's load alone, until SIGINT or SIGTERM, for
/// profiling a daemon by hand or comparing two daemons on one load (each daemon's CPU from
/// its /proc/PID/schedstat over the same seconds).
#[derive(clap::Args)]
pub struct ScaleLoadArgs {
    /// Long-lived processes.
    #[arg(long, default_value_t = LoadSpec::FULL.processes)]
    processes: usize,
    /// Short-lived processes started per second.
    #[arg(long, default_value_t = LoadSpec::FULL.births_per_s)]
    births_per_s: u32,
}

pub fn run_load(args: ScaleLoadArgs) -> Result<()> {
    let spec = LoadSpec {
        processes: args.processes,
        births_per_s: args.births_per_s,
        ..LoadSpec::FULL
    };
    // Blocked before the fork, so that a signal that comes early waits for sigwait (the
    // load inherits the mask; it is stopped with SIGKILL).
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let load = Load::start(spec)?;
    println!("ready: {}", spec.describe());
    let mut sig = 0;
    // SAFETY: set is a valid signal set; sig receives the signal number.
    unsafe { libc::sigwait(&set, &mut sig) };
    drop(load);
    Ok(())
}

/// Best effort: no RLIMIT_NPROC in the way of 1,000 processes and their births.
pub(super) fn raise_nproc() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &unlimited) };
}

pub(super) fn set_comm(name: &str) {
    let name = CString::new(name).expect("no NUL");
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Dies with `parent` (the bench); exits now if it is already gone.
unsafe fn die_with(parent: libc::pid_t) {
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != parent {
            libc::_exit(1);
        }
    }
}

/// The leader: forks the long-lived processes, then one birth every 1/births_per_s s.
unsafe fn run_leader(spec: LoadSpec, shared: &Shared, parent: libc::pid_t, bin: &CString) -> ! {
    unsafe {
        libc::setpgid(0, 0);
        die_with(parent);
        set_comm(LOAD_COMM);
        let me = libc::getpid();
        for i in 0..spec.processes {
            match libc::fork() {
                0 => run_worker(i, spec, shared, me),
                pid if pid > 0 => shared.pids[i].store(pid, Ordering::Relaxed),
                _ => libc::_exit(2),
            }
        }
        if spec.births_per_s == 0 {
            loop {
                libc::pause();
            }
        }
        let argv = [bin.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        let period = Duration::from_secs(1) / spec.births_per_s;
        let start = Instant::now();
        let mut k: u32 = 0;
        loop {
            let due = start + period * k;
            let now = Instant::now();
            if due > now {
                sleep(due - now);
            }
            match libc::fork() {
                0 => {
                    libc::execve(bin.as_ptr(), argv.as_ptr(), envp.as_ptr());
                    libc::_exit(127);
                }
                pid if pid > 0 => {
                    shared.births.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    shared.failed_births.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut status = 0;
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            k = k.wrapping_add(1);
        }
    }
}

unsafe fn run_worker(i: usize, spec: LoadSpec, shared: &Shared, leader: libc::pid_t) -> ! {
    unsafe {
        die_with(leader);
        // Phases spread over the second, so that the wake-ups are too.
        let phase = Duration::from_micros((i as u64 * 997_003) % 1_000_000);
        if i.is_multiple_of(spec.threads_every) {
            for t in 0..spec.extra_threads {
                let offset = phase + Duration::from_micros(250_000 * (t as u64 + 1));
                let _ = std::thread::Builder::new()
                    .stack_size(64 << 10)
                    .spawn(move || tick_loop(offset));
            }
        }
        shared.ready.fetch_add(1, Ordering::Relaxed);
        tick_loop(phase)
    }
}

/// One thread's periodic work: a few syscalls and ~20 µs of CPU once a second.
pub(super) fn tick_loop(phase: Duration) -> ! {
    sleep(Duration::from_nanos(
        (phase.as_nanos() % 1_000_000_000) as u64,
    ));
    let path = CString::new("/dev/null").expect("no NUL");
    let buf = [0u8; 64];
    loop {
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, buf.as_ptr() as *const _, buf.len());
                libc::close(fd);
            }
            libc::getppid();
        }
        let t = Instant::now();
        let mut x = 1u64;
        while t.elapsed() < Duration::from_micros(20) {
            for _ in 0..100 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        sleep(Duration::from_secs(1));
    }
}
