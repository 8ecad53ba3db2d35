"""``python -m hvd_magic.demo NOTEBOOK``: run a notebook headlessly in a real kernel, print its outputs.

What `make demo` runs on notebooks/quickstart.ipynb: every cell is executed by nbclient in an
IPython kernel, and what each cell printed and returned is printed here, cell by cell.

The kernel talks to us over IPC sockets (files in a temporary folder) rather than TCP, which is
all a kernel on this machine needs; over TCP without CurveZMQ keys ipykernel warns, on the
kernel's stderr, that its messages travel unencrypted, and that warning would open the demo.
"""

import os
import sys
import tempfile


def outputs_text(nb):
    """The text a person would see under each code cell."""
    parts = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        shown = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                shown.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "text/plain" in data and "application/vnd.jupyter.widget-view+json" not in data:
                    shown.append(data["text/plain"] + "\n")
            elif out.output_type == "error":
                shown.append("\n".join(out.traceback) + "\n")
        source = cell.source.strip().splitlines()
        parts.append(f"--- cell {i}: {source[0] if source else ''}\n" + "".join(shown))
    return "".join(parts)


def main(path):
    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    nb = nbformat.read(path, as_version=4)
    # Nobody looks at widgets here: the kernel uses the text view, whose lines are printed below.
    os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
    with tempfile.TemporaryDirectory(prefix="hvd_magic-demo-") as sockets:
        # As configuration (not a KernelManager of ours), so that nbclient owns the kernel and
        # shuts it down; a kernel left to notice that its parent exited warns about it.
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
        NotebookClient(nb, timeout=600, kernel_name="python3", config=ipc,
                       resources={"metadata": {"path": "."}}).execute()
    sys.stdout.write(outputs_text(nb))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "notebooks/quickstart.ipynb")
