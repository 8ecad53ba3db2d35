"""The dashboard's Stacks button: every rank's Python stack now, grouped by where the ranks are.

A click (handled by the dashboard's subshell while the cell runs) calls `run.stacks()` and
shows its grouped view under the header (`hvd_magic.driver.stack_groups.stacks_html`): a few
groups at np 256, not one stack per rank; each user frame's locals a click further.
"""

import html

from ..driver.stack_groups import stacks_html


def button_layout():
    """A header button's: its own size, never squeezed by the header's text."""
    import ipywidgets as w

    return w.Layout(width="auto", min_width="6em", flex="0 0 auto", margin="0 0 0 1em")


class StacksPanel:
    """The button and the panel it fills."""

    def __init__(self, run):
        import ipywidgets as w

        self.button = w.Button(description="Stacks", icon="list",
                               tooltip="Every rank's Python stack now, grouped by where it is",
                               layout=button_layout())
        self.html = w.HTML("")
        self.button.on_click(lambda _button: self.show(run))

    def show(self, run):
        self.button.disabled = True
        try:
            self.html.value = stacks_html(run.stacks())
        except RuntimeError as exc:  # the run has ended, and kept no stacks
            self.html.value = f"<div>{html.escape(str(exc))}</div>"
        finally:
            self.button.disabled = False
