// Kafka Streams' side of `snapfence-bench job` (bench/src/job.rs): the per-key count over the input topic,
// exactly_once_v2, commit.interval.ms 1000, the default RocksDB store. The runner fetches kafka-streams 4.4.0
// with Maven into a cache folder (bench/src/streams.rs), compiles this file with javac against it and starts
// one JVM per group member:
//   java -Xmx1g -cp "<streams libs>/*:DIR" StreamsJob BOOTSTRAP INPUT APP_ID STATE_DIR SESSION_MS HEARTBEAT_MS OUTPUT|-
// Without an output topic the topology is the DSL's canonical count, groupByKey().count(), with its record
// cache (the default 10 MiB): what a Streams user writes. With one, a processor over a cached RocksDB
// KeyValueStore counts and forwards one record per input event, value = the input's timestamp (8 bytes, big
// endian), its offset (8) and the key's new count (8); the output's timestamp is the input's, as Streams
// sets it.
// It prints `HOLD p,p,...` (the input partitions of its active tasks) whenever that set changes, so the
// runner knows when a member holds partitions; everything else (progress, commits) the runner reads from
// the broker. It runs until the runner kills it, or until its stdin closes (the runner is gone).
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.*;
import java.util.stream.Collectors;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.*;
import org.apache.kafka.streams.kstream.*;
import org.apache.kafka.streams.processor.api.*;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.*;

public class StreamsJob {
    public static void main(String[] a) throws Exception {
        if (a.length != 8) {
            System.err.println("usage: StreamsJob BOOTSTRAP INPUT APP_ID STATE_DIR SESSION_MS HEARTBEAT_MS INTERVAL_MS OUTPUT|-");
            System.exit(2);
        }
        String bootstrap = a[0], input = a[1], appId = a[2], stateDir = a[3], output = a[7];
        int sessionMs = Integer.parseInt(a[4]), heartbeatMs = Integer.parseInt(a[5]);
        int intervalMs = Integer.parseInt(a[6]);
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, intervalMs);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        // The classic rebalance protocol, with the session timeout and heartbeat interval the runner gives
        // snapfence too: a killed member is noticed when its session expires.
        p.put("group.protocol", "classic");
        p.put(StreamsConfig.consumerPrefix("session.timeout.ms"), sessionMs);
        p.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), heartbeatMs);
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        KStream<byte[], byte[]> events =
            builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()));
        if (output.equals("-")) {
            events.groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .count(Materialized.<byte[], Long, KeyValueStore<Bytes, byte[]>>as("counts")
                    .withKeySerde(Serdes.ByteArray()).withValueSerde(Serdes.Long()));
        } else {
            builder.addStateStore(Stores.keyValueStoreBuilder(
                    Stores.persistentKeyValueStore("counts"), Serdes.ByteArray(), Serdes.Long())
                .withCachingEnabled());
            events.process(Count::new, "counts")
                .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), p);
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            System.exit(1);
            return null;
        });
        // The runner holds this process's stdin open; when it goes away (EOF), so does this process, so a
        // runner that dies never leaves a job running.
        Thread orphanGuard = new Thread(() -> {
            try {
                while (System.in.read() != -1) {}
            } catch (java.io.IOException e) {
                // a broken stdin means the same
            }
            Runtime.getRuntime().halt(0);
        });
        orphanGuard.setDaemon(true);
        orphanGuard.start();
        streams.start();
        String held = "";
        while (true) {
            Thread.sleep(50);
            SortedSet<Integer> parts = new TreeSet<>();
            try {
                for (ThreadMetadata t : streams.metadataForLocalThreads())
                    for (TaskMetadata task : t.activeTasks())
                        task.topicPartitions().stream().filter(tp -> tp.topic().equals(input))
                            .forEach(tp -> parts.add(tp.partition()));
            } catch (IllegalStateException notRunning) {
                continue;
            }
            String now = parts.stream().map(String::valueOf).collect(Collectors.joining(","));
            if (!now.equals(held)) {
                held = now;
                System.out.println("HOLD " + now);
                System.out.flush();
            }
        }
    }

    /** Counts per key in a RocksDB store and forwards one record per event (the `--output` variant). */
    static class Count implements Processor<byte[], byte[], byte[], byte[]> {
        private ProcessorContext<byte[], byte[]> context;
        private KeyValueStore<byte[], Long> counts;

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.context = context;
            this.counts = context.getStateStore("counts");
        }

        @Override
        public void process(Record<byte[], byte[]> event) {
            Long before = counts.get(event.key());
            long count = before == null ? 1 : before + 1;
            counts.put(event.key(), count);
            long offset = context.recordMetadata().map(RecordMetadata::offset).orElse(-1L);
            ByteBuffer value = ByteBuffer.allocate(24);
            value.putLong(event.timestamp()).putLong(offset).putLong(count);
            context.forward(event.withValue(value.array()));
        }
    }
}
