from setuptools import setup

setup(
    name="tierfs",
    version="0.1.0",
    description="Tiered storage for append-only segments: journal, chunks, object storage",
    python_requires=">=3.11",
    # fuse/ and fsspec_impl/ live at the top of the repository (design card) but are
    # installed inside the tierfs namespace, so `import fuse` (fusepy) is never taken.
    # benchmarks/ is not installed: run it from the source tree (python -m benchmarks).
    packages=[
        "tierfs", "tierfs.contracts", "tierfs.blocks", "tierfs.engine", "tierfs.offload",
        "tierfs.store", "tierfs.server", "tierfs.remote", "tierfs.spark", "tierfs.cli", "tierfs.testing",
        "tierfs.fuse", "tierfs.fsspec_impl", "tierfs.spark.autoregister", "pyspark_tierfs",
    ],
    package_dir={
        "tierfs": "tierfs",
        "tierfs.fuse": "fuse",
        "tierfs.fsspec_impl": "fsspec_impl",
        # PySpark >= 4.0 registers DefaultSource of installed pyspark_* packages itself
        "pyspark_tierfs": "tierfs/spark/autoregister",
    },
    install_requires=[
        "trio>=0.25",
        "fsspec>=2024.2",
        "s3fs>=2024.2",
        "protobuf>=4.25",
        "cachetools>=5.3",
        "crc32c>=2.4",
        "hypercorn>=0.16",
        "starlette>=0.37",
        "httpx>=0.27",
        "h11>=0.14",  # tierfs.testing.fault_proxy (already there through httpx and hypercorn)
        "prometheus-client>=0.20",
        "pyfuse3>=3.3",  # needs libfuse3-dev and pkg-config to build (dev.sh installs them)
        "psycopg[binary]>=3.2,<3.4",  # --metadata postgresql://... (imported only then)
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-trio>=0.8",
            "moto[server]>=5",
            "boto3",
            "ruff",
            "mypy",
            "types-protobuf",
            "types-cachetools",
            "pandas",
            "pyarrow",
            "pyspark>=4.0",
        ],
        # python -m benchmarks (source tree only): boto3 creates the S3 server's
        # buckets, pyspark runs the spark benchmark; Node.js/npm install s3rver.
        "bench": [
            "boto3",
            "pyspark>=4.0",
        ],
    },
    entry_points={
        "console_scripts": ["tierfs = tierfs.cli:main"],
        "fsspec.specs": ["tierfs = tierfs.fsspec_impl.filesystem:TierFileSystem"],
    },
)
