"""A datacenter's storage behind one interface (base.py): POSIX (local disk, CephFS) or HDFS."""
