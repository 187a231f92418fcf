/* The C floor of a repeated 8-byte all-reduce: what a Python call approaches.
 *
 *     mpicc -O2 -o /tmp/allreduce_floor examples/allreduce_floor.c
 *     mpirun -n 2 /tmp/allreduce_floor 20000 [multiple]
 *
 * Built with each family's own mpicc (its wheel ships one; Intel MPI's runtime
 * runs MPICH's build, the two share an ABI). ``multiple`` initialises MPI with
 * MPI_THREAD_MULTIPLE, the level mpi4py asks for by default. A hot loop of
 * MPI_Allreduce(MPI_IN_PLACE, 2 floats, MPI_SUM) in 7 rounds of N calls, each
 * after a barrier; prints the median of the rounds' slowest-rank µs a call, as
 * examples/callpath.py times the Python paths (docs/performance.md). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 7

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int provided, multiple = argc > 2 && strcmp(argv[2], "multiple") == 0;
    MPI_Init_thread(&argc, &argv, multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
    int rank, n = argc > 1 ? atoi(argv[1]) : 20000;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    float buf[2] = {0.0f, 0.0f};
    double rounds[ROUNDS];
    for (int i = 0; i < 1000; i++)  /* warm up */
        MPI_Allreduce(MPI_IN_PLACE, buf, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int r = 0; r < ROUNDS; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < n; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double took = (MPI_Wtime() - t0) / n * 1e6;
        MPI_Allreduce(&took, &rounds[r], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    qsort(rounds, ROUNDS, sizeof rounds[0], by_value);
    if (rank == 0)
        printf("{'c': %.2f}\n", rounds[ROUNDS / 2]);
    MPI_Finalize();
    return 0;
}
