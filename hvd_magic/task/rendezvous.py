"""Horovod's HTTP rendezvous server, started by task 0 of a launch."""

import threading


class Rendezvous:
    """Horovod's HTTP rendezvous server for one run, on every IPv4 interface, a free port.

    Horovod's own `RendezvousServer` takes up to half a second to stop (its serve loop polls at
    0.5 s) and leaves its socket open; this one stops at once and closes it.
    """

    POLL_SECONDS = 0.05

    def __init__(self, plan):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
        self.httpd = RendezvousHTTPServer(("0.0.0.0", 0), RendezvousHandler, 0)
        self.httpd.init(plan)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       args=(self.POLL_SECONDS,), name="hvd-magic-rendezvous",
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
