"""A full disk for one command, without filling the machine's: a tmpfs of its own."""

import os
import subprocess


def on_small_disk(mount, options, shell, timeout=240):
    """Run the shell command ``shell`` with a tmpfs mounted at ``mount`` (``options``:
    mount's, such as ``size=64k``) in a mount namespace of its own, which ends with the
    command (``unshare``; a user namespace too where not root). One thread for MXNet.

    Returns
    -------
    subprocess.CompletedProcess
        With the command's output as text.
    """
    os.makedirs(mount, exist_ok=True)
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return subprocess.run(
        [
            "unshare",
            *user,
            "--mount",
            "sh",
            "-c",
            f"mount -t tmpfs -o {options} tmpfs {mount} && {shell}",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
