from setuptools import find_packages, setup

# tested together (see the test extra): s3fs pins fsspec, aiobotocore pins botocore
S3_CLIENT_STACK = ["s3fs==2026.9.0", "aiobotocore==3.10.0", "boto3==1.43.117"]

setup(
    name="tierfs",
    version="0.1.0",
    description="Tiered storage for append-only segments: journal, chunks, object storage",
    python_requires=">=3.11",
    # fuse/ and fsspec_impl/ live at the top of the repository (design card) but are
    # installed inside the tierfs namespace, so `import fuse` (fusepy) is never taken.
    # benchmarks/ is not installed: run it from the source tree (python -m benchmarks).
    packages=[
        *find_packages(include=["tierfs", "tierfs.*"]),
        "tierfs.fuse", "tierfs.fsspec_impl", "pyspark_tierfs",
    ],
    package_dir={
        "tierfs": "tierfs",
        "tierfs.fuse": "fuse",
        "tierfs.fsspec_impl": "fsspec_impl",
        # PySpark >= 4.0 registers DefaultSource of installed pyspark_* packages itself
        "pyspark_tierfs": "tierfs/spark/autoregister",
    },
    # Every dependency is bounded (tested majors) so both the pip a fresh venv ships and
    # a current pip resolve in seconds (tests/test_install_resolves.py).
    install_requires=[
        "trio>=0.25,<0.40",
        "fsspec>=2024.2",  # s3fs pins fsspec to its own release
        "s3fs>=2024.2,<2028",
        "protobuf>=4.25,<8",
        "cachetools>=5.3,<9",
        "crc32c>=2.4,<3",
        "hypercorn>=0.16,<0.20",
        "starlette>=0.37,<2",
        "httpx>=0.27,<0.30",
        "h11>=0.14,<0.17",  # tierfs.testing.faults.fault_proxy (already there through httpx and hypercorn)
        "prometheus-client>=0.20,<1",
        "pyfuse3>=3.3,<4",  # needs libfuse3-dev and pkg-config to build (dev.sh installs them)
        "psycopg[binary]>=3.2,<3.4",  # --metadata postgresql://... (imported only then)
        "shtab==1.13.0",  # tierfs completion bash: generated from the parser (pinned: its output is tested)
    ],
    extras_require={
        "test": [
            "pytest>=8,<10",
            "pytest-trio>=0.8,<0.9",
            "pytest-xdist>=3.8,<4",  # the suite on three workers (dev.sh test); 3.8 has loadscopereorder (conftest)
            "moto[server]>=5,<6",
            "cryptography>=42,<52",  # the suite's TLS certificates (tierfs.testing.cluster; moto needs it too)
            # The S3 client stack as one tested set: aiobotocore pins the exact botocore
            # range it works with, and moto needs boto3, whose newest release needs a
            # newer botocore. Unpinned, pip 23 (a fresh venv's) reports ResolutionImpossible
            # and a current pip backtracks for minutes. Move the three together.
            *S3_CLIENT_STACK,
            # exact: a new release's rules must not fail ./dev.sh test on an unchanged tree
            "ruff==0.17.6",
            "mypy==2.4.1",
            "types-protobuf",
            "types-cachetools",
            "pandas>=2.2,<3",  # PySpark 4 warns (FutureWarning) on pandas 3
            "pyarrow>=15,<30",
            "pyspark>=4.0,<5",
            "dask[dataframe]>=2024.12,<2027",  # its writers through tierfs:// (tests/test_fsspec.py)
        ],
        # python -m benchmarks (source tree only): boto3 creates the S3 server's
        # buckets, pyspark runs the spark benchmark; Node.js/npm install s3rver.
        "bench": [
            *S3_CLIENT_STACK,
            "pyspark>=4.0,<5",
        ],
    },
    entry_points={
        "console_scripts": ["tierfs = tierfs.cli:main"],
        "fsspec.specs": ["tierfs = tierfs.fsspec_impl.filesystem:TierFileSystem"],
    },
)
