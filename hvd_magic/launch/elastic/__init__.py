"""The elastic launchers (``--min-np``): a run that loses a rank goes on with the others.

- `launcher`: `ElasticLauncher`, Horovod's elastic driver over our slots, and
  `ElasticLocalLauncher` (``--np -N``);
- `horovod`: Horovod's own elastic pieces (rendezvous, driver, discovery) told to our launcher;
- `hosts`: a ring's local and cross ranks by the machine each slot runs on;
- `spark`: `ElasticSparkLauncher` (``--np N``): a Spark job of one plain task per slot;
- `ddp`: torch.distributed's elastic runs (`hvd_magic.elastic`): our own membership, no Horovod;
- `session`: elastic warm sessions, which replace no one.
"""
